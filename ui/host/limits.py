"""Limits the host sets, from the environment (`load_limits`), with defaults that fit a small shared machine. Every
variable, its default, range and meaning is in one table: docs/hosting.md, "Settings" (tests/test_readme_settings.py
holds the two together).

Why one torch thread per page by default (KVSCOPE_THREADS): on a shared server the passes of several pages (and, on a
laptop, the browser) run at once. With 2 threads on 2 busy cores a decode step took 266 ms, with 1 thread 116 ms, a
200-token prefill 1.8 s against 1.0 s. Alone, a decode step is as fast with 1 (95 ms) as with 2 (92 ms); only a long
prefill gains from more (0.9 → 0.6 s): a teacher's own machine may set more.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ui.state.link import RANGES, AppState, Problem

if TYPE_CHECKING:
    from engine.model_info import ModelInfo


@dataclass(frozen=True)
class Limits:
    models: tuple[str, ...] = ("embedded", "embedded-zh")
    allow_any_model: bool = False
    max_prompt_tokens: int = 384
    max_new_tokens: int = 128
    cache_tokens: int = 512
    full_traces: int = 8
    shared_runs_mb: int = 256
    shared_prefix_cache: bool = False
    shared_cache_tokens: int = 8192
    lease_seconds: int = 600
    min_pace: float = 0.3
    step_memory_mb: int = 128  # a class of 30, 8 of them on the heaviest links, within 2.4 GB with both models
    memory_mb: int = 0  # the host's memory; 0: the container's limit, if any
    threads: int = 1
    dtype: str = "auto"  # one of DTYPES
    bad_dtype: str = ""  # KVSCOPE_DTYPE as given when it was not one of DTYPES (the default is used)

    def model_allowed(self, spec: str) -> bool:
        return self.allow_any_model or spec in self.models


DTYPES = ("auto", "float32", "bfloat16")  # the first is the default


def _dtype(env) -> tuple[str, str]:
    """(dtype, the value given when it is not one of DTYPES): KVSCOPE_DTYPE, case and spaces ignored."""
    given = env.get("KVSCOPE_DTYPE", DTYPES[0])
    name = given.strip().lower()
    return (name, "") if name in DTYPES else (DTYPES[0], given)


def _number(env, name: str, default, low, high, kind):
    """Setting `name` read as `kind` and clamped into [low, high]; the default when it is unset, empty or not a
    number."""
    try:
        return min(max(kind(env.get(name) or default), low), high)
    except ValueError:
        return default


def _int(env, name: str, default: int, low: int, high: int) -> int:
    return _number(env, name, default, low, high, int)


def env_seconds(env, name: str, default: float, low: float, high: float = float("inf")) -> float:
    """A setting in seconds (Play's fastest pace, the follower's poll, the leader's heartbeat)."""
    return _number(env, name, default, low, high, float)


def load_limits(env=os.environ) -> Limits:
    extra = tuple(m.strip() for m in env.get("KVSCOPE_MODELS", "").split(",") if m.strip())
    dtype, bad_dtype = _dtype(env)
    return Limits(
        models=Limits.models + tuple(m for m in extra if m not in Limits.models),
        allow_any_model=env.get("KVSCOPE_ALLOW_ANY_MODEL", "0") == "1",
        max_prompt_tokens=_int(env, "KVSCOPE_MAX_PROMPT_TOKENS", Limits.max_prompt_tokens, 1, 100_000),
        max_new_tokens=_int(env, "KVSCOPE_MAX_NEW_TOKENS", Limits.max_new_tokens, 1, 100_000),
        cache_tokens=_int(env, "KVSCOPE_CACHE_TOKENS", Limits.cache_tokens, 64, 1_000_000),
        full_traces=_int(env, "KVSCOPE_FULL_TRACES", Limits.full_traces, 1, 10_000),
        shared_runs_mb=_int(env, "KVSCOPE_SHARED_RUNS_MB", Limits.shared_runs_mb, 0, 1_000_000),
        shared_prefix_cache=env.get("KVSCOPE_SHARED_PREFIX_CACHE", "0") == "1",
        shared_cache_tokens=_int(env, "KVSCOPE_SHARED_CACHE_TOKENS", Limits.shared_cache_tokens, 64, 10_000_000),
        lease_seconds=_int(env, "KVSCOPE_LEASE_SECONDS", Limits.lease_seconds, 10, 7 * 24 * 3600),
        min_pace=env_seconds(env, "KVSCOPE_MIN_PACE", Limits.min_pace, 0.05),
        step_memory_mb=_int(env, "KVSCOPE_STEP_MEMORY_MB", Limits.step_memory_mb, 16, 1_000_000),
        memory_mb=_int(env, "KVSCOPE_MEMORY_MB", Limits.memory_mb, 0, 10_000_000),
        threads=_int(env, "KVSCOPE_THREADS", Limits.threads, 1, 1024),
        dtype=dtype,
        bad_dtype=bad_dtype,
    )


APP_MAX_KV_SPLITS = RANGES["kv_splits"][2]  # the link's range; the engine allows up to engine.split_kv.MAX_KV_SPLITS
BLOCK_BYTES = 1024  # per block: its bookkeeping (150–300 B measured with tracemalloc) and the KV view's drawing of it


@dataclass(frozen=True)
class StepLimits:
    """What one page may ask of one model within the host's step memory budget (KVSCOPE_STEP_MEMORY_MB).

    The budget is shared out: the attention view's full-heatmap pass (estimated by ModelInfo.attention_bytes,
    with its n × n record) may use all of it; the split-KV records of the kept traces a quarter; per-block
    bookkeeping an eighth. The default prompt and answer limits fit well inside it (docs/hosting.md, "Settings").
    """

    max_kv_splits: int
    min_block_size: int
    max_attention_tokens: int  # the longest sequence whose full heatmap fits (its pass keeps a layer's n × n too)


def step_limits(limits: Limits, info: ModelInfo) -> StepLimits:
    """Derive the limits for the model described by `info` (an engine ModelInfo)."""
    budget = limits.step_memory_mb * 10**6
    kept = limits.full_traces + 2  # the kept traces, the step being computed and one rebuilt older step
    splits = (budget // 4) // (kept * info.split_record_bytes(1))
    tokens = max(
        limits.cache_tokens,
        limits.shared_cache_tokens if limits.shared_prefix_cache else 0,
        limits.max_prompt_tokens + limits.max_new_tokens,
    )
    block = -(-tokens * BLOCK_BYTES // (budget // 8))
    return StepLimits(
        max_kv_splits=max(1, min(APP_MAX_KV_SPLITS, splits)),
        min_block_size=max(1, block),
        max_attention_tokens=_largest(lambda n: 2 * info.attention_bytes(n, n) <= budget),
    )


REFERENCE_KV_BYTES = 46_080  # K/V bytes a token of SmolLM2-135M in float32: the model the token limits are set for


def model_limits(limits: Limits, info: ModelInfo) -> Limits:
    """The host's limits for the model described by `info`. The prompt and cache limits are counted in positions of
    a model whose K/V take REFERENCE_KV_BYTES a token: a model whose K/V take fewer gets as many more positions as
    the same bytes hold (Gemma 3 270M in bfloat16, 18,432 B: 2.5 times, so a run can pass its window of 512), the
    prompt no longer than the longest whose attention fits the step memory (`StepLimits.max_attention_tokens`: its
    prefill and its heatmap). Never fewer than the host set; SmolLM2 in float32 keeps them as they are."""
    scale = max(1.0, REFERENCE_KV_BYTES / info.kv_bytes_per_token)
    # the heatmap of the run's last step (prompt and every new token) must fit, not only the prompt's
    longest = step_limits(limits, info).max_attention_tokens - limits.max_new_tokens
    prompt = max(limits.max_prompt_tokens, min(int(limits.max_prompt_tokens * scale), longest))
    return replace(limits, max_prompt_tokens=prompt, cache_tokens=int(limits.cache_tokens * scale))


def _largest(fits, high: int = 1 << 24) -> int:
    """The largest n in [0, high] for which `fits(n)` holds (`fits` true up to some n, false after)."""
    low = 0
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low


def fit_state(state: AppState, step: StepLimits) -> tuple[AppState, list[Problem]]:
    """Clamp kv_splits and block_size into what `step` allows; a Problem (reason "over_budget") for each."""
    fitted = {
        "kv_splits": min(state.kv_splits, step.max_kv_splits),
        "block_size": max(state.block_size, step.min_block_size),
    }
    problems = [
        Problem(name, str(getattr(state, name)), str(value), "over_budget")
        for name, value in fitted.items()
        if value != getattr(state, name)
    ]
    return replace(state, **fitted), problems

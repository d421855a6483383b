"""Limits the host sets, from the environment, with defaults that fit a small shared machine.

KVSCOPE_MODELS             comma-separated model specs the app may load ("embedded" is always allowed)
KVSCOPE_ALLOW_ANY_MODEL    1: any hub id or local folder may be loaded (a teacher's own laptop)
KVSCOPE_MAX_PROMPT_TOKENS  longest prompt, in tokens (default 384)
KVSCOPE_MAX_NEW_TOKENS     most tokens one run generates (default 128)
KVSCOPE_CACHE_TOKENS       K/V positions in each browser session's pool, prefix cache included (default 512)
KVSCOPE_FULL_TRACES        latest steps whose tensors a session keeps; older ones are replayed (default 8)
KVSCOPE_SHARED_PREFIX_CACHE 1: one prefix cache for the whole class (prompts then reuse each other's K/V)
KVSCOPE_SHARED_CACHE_TOKENS K/V positions in that shared pool (default 8192)
KVSCOPE_MIN_PACE           fastest autoplay, seconds per token (default 0.3)

The defaults fit Streamlit Community Cloud's free tier (2.7 GB) with 30 students at once; README's
"Hosting" section has the measured figures.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    models: tuple[str, ...] = ("embedded",)
    allow_any_model: bool = False
    max_prompt_tokens: int = 384
    max_new_tokens: int = 128
    cache_tokens: int = 512
    full_traces: int = 8
    shared_prefix_cache: bool = False
    shared_cache_tokens: int = 8192
    min_pace: float = 0.3

    def model_allowed(self, spec: str) -> bool:
        return self.allow_any_model or spec in self.models


def _int(env, name: str, default: int, low: int, high: int) -> int:
    try:
        return min(max(int(env.get(name, default)), low), high)
    except ValueError:
        return default


def load_limits(env=os.environ) -> Limits:
    extra = tuple(m.strip() for m in env.get("KVSCOPE_MODELS", "").split(",") if m.strip())
    try:
        pace = max(0.05, float(env.get("KVSCOPE_MIN_PACE", 0.3)))
    except ValueError:
        pace = 0.3
    return Limits(
        models=("embedded",) + tuple(m for m in extra if m != "embedded"),
        allow_any_model=env.get("KVSCOPE_ALLOW_ANY_MODEL", "0") == "1",
        max_prompt_tokens=_int(env, "KVSCOPE_MAX_PROMPT_TOKENS", 384, 1, 100_000),
        max_new_tokens=_int(env, "KVSCOPE_MAX_NEW_TOKENS", 128, 1, 100_000),
        cache_tokens=_int(env, "KVSCOPE_CACHE_TOKENS", 512, 64, 1_000_000),
        full_traces=_int(env, "KVSCOPE_FULL_TRACES", 8, 1, 10_000),
        shared_prefix_cache=env.get("KVSCOPE_SHARED_PREFIX_CACHE", "0") == "1",
        shared_cache_tokens=_int(env, "KVSCOPE_SHARED_CACHE_TOKENS", 8192, 64, 10_000_000),
        min_pace=pace,
    )

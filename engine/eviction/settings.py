"""Every setting an eviction run refuses, refused before anything runs: kvpress asserts some of them mid-run, or
scores NaN."""

from __future__ import annotations

from engine.checks import require_integer, require_number
from engine.errors import InvalidSettingError
from engine.eviction.budgets import HIDDEN_STATES_BUFFER, DecodeBudget, StreamingWindow
from engine.eviction.policies import PREFILL_ONLY, Policy
from engine.model import Model
from engine.settings import check_prompt_fits


def check_run(
    model: Model,
    prompt_ids: list[int],
    policy: Policy | None,
    compression_ratio: float,
    budget: DecodeBudget | StreamingWindow | None,
    max_new_tokens: int,
    keep_full_steps: int,
    rerotate: bool,
) -> None:
    """`EvictionRun`'s arguments, checked in one place."""
    require_number(
        "compression_ratio", compression_ratio, 0, 1, high_open=True, why=" (the share of positions evicted)"
    )
    if rerotate:
        check_rerotation(model, policy, compression_ratio, budget)
    if policy is None and (compression_ratio > 0 or isinstance(budget, DecodeBudget)):
        raise InvalidSettingError("a compression ratio or a decode budget needs a policy to score positions")
    if budget is not None and not isinstance(budget, (DecodeBudget, StreamingWindow)):
        raise InvalidSettingError(f"budget must be a DecodeBudget or a StreamingWindow, got {budget!r}")
    require_integer("max_new_tokens", max_new_tokens, 1)
    require_integer("keep_full_steps", keep_full_steps, 1)
    if len(prompt_ids) < 2:
        raise InvalidSettingError(
            "eviction needs a prompt of at least 2 tokens: the context it evicts from, "
            "then the last prompt token that reads what was kept"
        )
    if isinstance(budget, DecodeBudget):
        check_budget(policy, budget)
    check_prompt_fits(list(prompt_ids), model)


def check_budget(policy: Policy, budget: DecodeBudget) -> None:
    """Refuse a budget the policy cannot keep, before anything runs (kvpress asserts the same mid-run, or scores
    NaN)."""
    if policy.name in PREFILL_ONLY:
        raise InvalidSettingError(
            f"{policy.name} shares a prefill's compression ratio between layers or heads and "
            f"runs after the prefill only here; for a decode budget choose snapkv"
        )
    if policy.name == "expected_attention" and min(budget.interval, HIDDEN_STATES_BUFFER + 1) <= policy.n_sink:
        raise InvalidSettingError(
            f"expected_attention models the queries since the last eviction less the first "
            f"{policy.n_sink} (n_sink): the interval must be larger than that, got "
            f"{budget.interval}"
        )
    if policy.name == "snapkv" and min(budget.interval, HIDDEN_STATES_BUFFER + 1) <= policy.window_size:
        raise InvalidSettingError(
            f"snapkv scores by the last {policy.window_size} queries (window_size): during "
            f"decode the interval must be larger than that, got {budget.interval}"
        )
    if policy.name == "streaming_llm" and budget.target_size <= policy.n_sink:
        raise InvalidSettingError(
            f"streaming_llm keeps {policy.n_sink} sink positions: the budget's target_size must "
            f"be larger, to keep recent ones too; got {budget.target_size}"
        )


def check_rerotation(
    model: Model, policy: Policy | None, compression_ratio: float, budget: DecodeBudget | StreamingWindow | None
) -> None:
    """Re-rotation is kvpress's KeyRerotationPress: around a policy's eviction after the prefill, on a model whose
    every layer evicts (Gemma 3's sliding-window layers keep their own positions) and rotates its keys (RoPE)."""
    if policy is None or compression_ratio <= 0 or budget is not None:
        raise InvalidSettingError(
            "re-rotation turns the keys a policy keeps after the prefill: it needs a policy "
            "and a compression ratio, and no decode budget or streaming window"
        )
    if policy.name in PREFILL_ONLY:
        raise InvalidSettingError(
            f"re-rotation (kvpress's KeyRerotationPress) keeps one count on every layer and "
            f"head: {policy.name}'s own budgets cannot be re-rotated"
        )
    info = model.info
    if info.positions == "learned" or any(info.window(i) is not None for i in range(info.layers)):
        raise InvalidSettingError(
            f"re-rotation needs rotary positions on every layer and no sliding-window layer; "
            f"{info.name} has {info.positions} positions"
            + (" and sliding-window layers" if info.sliding_window is not None else "")
        )

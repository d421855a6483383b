"""A generation's settings, checked once when the generation is made.

Each bad value raises `InvalidSettingError` (`PromptTooLongError` for a prompt that leaves no room)
with a message that says what is allowed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.checks import require_integer
from engine.errors import InvalidSettingError, PromptTooLongError
from engine.split_kv import MAX_KV_SPLITS

if TYPE_CHECKING:
    from engine.model import Model
    from engine.prefix_cache import PrefixCache


def check_settings(block_size: int, max_new_tokens: int, keep_full_traces: int, kv_splits: int) -> None:
    """KV block size, answer length, traces kept whole and KV splits: each an integer in its range."""
    require_integer("block_size", block_size, 1)
    require_integer("kv_splits", kv_splits, 1, MAX_KV_SPLITS, " (the engine's limit)")
    require_integer("max_new_tokens", max_new_tokens, 1)
    require_integer("keep_full_traces", keep_full_traces, 1)


def check_prefix_cache(prefix_cache: PrefixCache, model: Model, block_size: int) -> None:
    """A generation can share a prefix cache's pool only with the same model and block size."""
    if prefix_cache.model is not model:
        raise InvalidSettingError("the prefix cache belongs to another model")
    if block_size != prefix_cache.block_size:
        raise InvalidSettingError(
            f"block_size {block_size} differs from the prefix cache's block size {prefix_cache.block_size}"
        )


def check_prompt_fits(prompt_ids: list[int], model: Model) -> None:
    """The prompt must leave at least one position for the answer within the model's context limit."""
    limit = model.info.context_limit
    if len(prompt_ids) >= limit:
        raise PromptTooLongError(
            f"the prompt is {len(prompt_ids)} tokens; {model.info.name} reads at most {limit} positions, "
            f"so a prompt can have at most {limit - 1} tokens to leave room for an answer"
        )

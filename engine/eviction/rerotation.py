"""Re-rotated positions (kvpress's KeyRerotationPress, around a policy's eviction after the prefill): the keys each
(layer, KV head) kept of the n context positions are read turned to the positions 0 … n_kept − 1, in their order,
and the last prompt token and the answer go on from position n_kept, as kvpress's pipeline places them; the cache
still holds every key as written (a turn composes with the rotation already in it)."""

from __future__ import annotations

import torch

from engine.eviction.records import Eviction
from engine.model_info import ModelInfo


def rerotation(
    prefill_evictions: list[Eviction | None], context: int, info: ModelInfo, device: torch.device
) -> tuple[int, list[torch.Tensor | None]]:
    """kvpress's KeyRerotationPress after the prefill's evictions: each (layer, KV head) keeps n_kept context
    keys, turned to the positions 0 … n_kept − 1 in their order (per layer (kv_heads, context): the turn of
    each kept key, new position − old), and the passes after it go on from position n_kept: the shift of
    their rotary positions from their cache positions."""
    turns: list[torch.Tensor | None] = [None] * info.layers
    for layer, eviction in enumerate(prefill_evictions):
        if eviction is None:
            continue
        kept = eviction.kept_positions  # (kv_heads, n_kept), ascending
        turn = torch.zeros(info.kv_heads, context, dtype=torch.long)
        turn.scatter_(1, kept, torch.arange(kept.shape[1]).expand_as(kept) - kept)
        turns[layer] = turn.to(device)
    # the passes go on from the first layer's count, as kvpress's pipeline reads the cache's length there
    first = next(e for e in prefill_evictions if e is not None)
    return first.kept_rows.shape[1] - context, turns

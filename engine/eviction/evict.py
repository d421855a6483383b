"""What eviction does to one layer's rows: scored by a policy and the best of each KV head kept, or kept by position
(the streaming window); and what full attention would have put on the positions it hid (`evicted_share`)."""

from __future__ import annotations

import torch

from engine.eviction.budgets import StreamingWindow
from engine.eviction.policies import LayerInputs, Policy, select, select_per_head
from engine.eviction.records import Eviction
from engine.eviction.rows import LayerRows
from engine.rope import Rope


def evict_by_score(
    rows: LayerRows,
    policy: Policy,
    keys: torch.Tensor,
    values: torch.Tensor,
    probs: torch.Tensor | None,
    n_kept: int,
    queries: torch.Tensor | None,
    rope: Rope | None,
) -> Eviction:
    """Score the layer's `rows` by `policy` and keep the `n_kept` best of each KV head: `keys`, `values` its cached
    K/V as its table reads them; `queries` (q_heads, t, D) before RoPE: the passes that score; `rope` the layer's."""
    inputs = LayerInputs(rows.gather_keys(keys), rows.gather_probs(probs) if probs is not None else None)
    if policy.reads_values:
        inputs.values = rows.gather_keys(values)
    if policy.reads_queries:
        inputs.queries = queries
        future = torch.arange(queries.shape[1], queries.shape[1] + policy.n_future_positions)
        inputs.future_rope = rope.cos_sin(future.to(keys.device), keys.dtype)
    scores = policy.score(inputs, n_kept)
    if policy.name == "adakv":  # every row stays, each head hides its own
        held = select_per_head(scores, n_kept, policy.alpha_safeguard)
        every = torch.arange(rows.count).expand(held.shape[0], -1)
        eviction = Eviction(rows.positions.cpu(), scores.float().cpu(), every, held.cpu())
        rows.hide(held)
        return eviction
    eviction = Eviction(rows.positions.cpu(), scores.float().cpu(), select(scores, n_kept).cpu())
    rows.keep(eviction.kept_rows.to(rows.positions.device))
    return eviction


def evict_by_position(rows: LayerRows, window: StreamingWindow) -> Eviction | None:
    """Keep what `window` keeps of the layer's `rows` (None: all of them, nothing evicted)."""
    kept = window.keep(rows.positions)
    if kept is None:
        return None
    eviction = Eviction(rows.positions.cpu(), None, kept.cpu())
    rows.keep(kept)
    return eviction


def evicted_share(scores: torch.Tensor, kept: list[torch.Tensor | None], group: int) -> torch.Tensor:
    """(layers, q_heads): softmax of the full scores (no eviction) summed over what `kept` hid; `group` query heads
    share a KV head."""
    full = torch.softmax(scores.float(), dim=-1)
    hidden = torch.stack(
        [
            torch.zeros(scores.shape[1:], dtype=torch.bool) if m is None else ~m.cpu().repeat_interleave(group, dim=0)
            for m in kept
        ]
    )
    return (full * hidden).sum(dim=-1)

"""Attention of new queries over the cached keys and values, with GQA.

For one head: s_j = q·k_j · scale, a = softmax(s), out = Σ_j a_j v_j. The output is a head_dim
vector per head (not a word, not probabilities); the heads are concatenated for o_proj.
With GQA, Q head h reads KV head h // (q_heads / kv_heads), as in transformers' `repeat_kv`.
A sliding-window layer (Gemma 3's local layers) lets a query at p see keys p − window + 1 … p only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.split_kv import Merged, Partials, merge, merge_online, split_ranges


@dataclass
class AttentionResult:
    output: torch.Tensor  # (T, q_heads × head_dim): the concatenated head outputs
    probs: torch.Tensor  # (q_heads, T, L): softmax over the L cached positions, 0 where masked
    scores: torch.Tensor  # (q_heads, T, L): scaled scores q·k·scale, −inf where the causal mask hides a key
    # (not where `kept` hides one: they are what full attention would score, so a view can tell what eviction cost)
    split: SplitRecord | None = None  # with kv_splits > 1: the last query row's splits


@dataclass
class SplitRecord:
    """Split-KV for the last query row, per Q head (S splits, head_dim D)."""

    ranges: list[tuple[int, int]]
    partials: Partials  # max_score, exp_sum (q_heads, S); output (q_heads, S, D)
    merged: Merged  # output (q_heads, D), weight (q_heads, S)
    unsplit: torch.Tensor  # (q_heads, D): Σ_j a_j v_j over all keys at once


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_positions: torch.Tensor,
    scale: float,
    kv_splits: int = 1,
    window: int | None = None,
    first_key: int = 0,
    kept: torch.Tensor | None = None,
    sink_queries: tuple[int, torch.Tensor] | None = None,
) -> AttentionResult:
    """q: (T, q_heads, D) at positions q_positions (T,); k, v: (L − first_key, kv_heads, D) for positions
    first_key…L−1 (a sliding-window layer's cache starts past 0).

    A query at position p sees keys 0…p: prompt and answer are one sequence under a causal mask; with a
    `window`, keys p − window + 1 … p. Probabilities and scores cover all L positions all the same (0 and
    −inf before first_key), so every layer's record has one shape.
    With kv_splits > 1 the output is the merge of the splits' partial outputs (FlashDecoding).
    kept: (kv_heads, L) bool, False where KV eviction (`engine.eviction`) dropped a position from that KV head:
    its Q heads then read only what it kept (probabilities 0 there); or (kv_heads or 1, T, L), one row per query
    (a teacher-forced pass over many positions, each reading what its own step would have kept).
    sink_queries: (s, q_sinks), the first s keys scored against q_sinks (T, q_heads, D) instead of q: each query
    turned back by its own turn of the sinks (StreamingLLM's positions inside the cache, `engine.eviction.nll`).
    """
    if first_key:  # the positions the cache no longer holds: a zero value and a masked score each
        k, v = (torch.cat((x.new_zeros(first_key, *x.shape[1:]), x)) for x in (k, v))
    t, q_heads, d = q.shape
    length, kv_heads, _ = k.shape
    group = q_heads // kv_heads
    # (kv_heads, group·T, D): the Q heads sharing a KV head stacked, so one batched matmul per KV
    # head reads its K and V once, with no copy of them per Q head.
    qh = q.view(t, kv_heads, group, d).permute(1, 2, 0, 3).reshape(kv_heads, group * t, d)
    kh = k.permute(1, 0, 2)  # (kv_heads, L, D)
    vh = v.permute(1, 0, 2)
    scores = (torch.bmm(qh, kh.transpose(1, 2)) * scale).view(kv_heads, group, t, length)
    if sink_queries is not None:  # R(−t)q · k = q · R(t)k: each query reads the sinks turned by its own t
        sinks, q_sinks = sink_queries
        qs = q_sinks.view(t, kv_heads, group, d).permute(1, 2, 0, 3).reshape(kv_heads, group * t, d)
        scores[..., :sinks] = (torch.bmm(qs, kh[:, :sinks].transpose(1, 2)) * scale).view(kv_heads, group, t, sinks)
    key_positions = torch.arange(length, device=q.device)
    hidden = key_positions[None, :] > q_positions[:, None]  # (T, L): the future
    if window is not None:  # and what slid out of the window
        hidden |= key_positions[None, :] <= q_positions[:, None] - window
    if hidden.any():
        scores = scores.masked_fill(hidden, float("-inf"))
    read = scores
    if kept is not None:  # over the scores' (kv_heads, group, T, L): the same for the group (and every query)
        rows = kept[:, None, None, :] if kept.dim() == 2 else kept[:, None]
        read = scores.masked_fill(~rows, float("-inf"))
    probs = torch.softmax(read, dim=-1, dtype=torch.float32).to(q.dtype)
    out = torch.bmm(probs.view(kv_heads, group * t, length), vh).view(kv_heads, group, t, d)
    split = None
    if kv_splits > 1:
        ranges = split_ranges(length, kv_splits)
        # In float32 whatever the model's dtype, as FlashDecoding kernels keep their running max, sums and
        # outputs: in bfloat16 each exp and sum would round, and the merge drift from unsplit by more than one
        # rounding of the output the layer goes on with.
        merged, last = merge_online(read.float(), vh.float().unsqueeze(1), kv_splits)  # (kv_heads, group, T, D)
        split = SplitRecord(
            ranges=ranges,
            partials=Partials(*(x.reshape(q_heads, *x.shape[2:]) for x in (last.max_score, last.exp_sum, last.output))),
            # Copies of the last row: a view would keep the layer's whole (…, T, D) outputs alive.
            merged=Merged(merged[:, :, -1].reshape(q_heads, d).clone(), merge(last).weight.reshape(q_heads, -1)),
            unsplit=out[:, :, -1].reshape(q_heads, d).clone(),
        )
        out = merged.to(q.dtype)  # the layer goes on with the merged output
    output = out.permute(2, 0, 1, 3).reshape(t, q_heads * d)
    return AttentionResult(output, probs.reshape(q_heads, t, length), scores.reshape(q_heads, t, length), split)

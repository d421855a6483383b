"""Split-KV attention (FlashDecoding): split the cached history, not the answer, and merge exactly.

Split i covers keys S_i. It computes, for each query, its max score m_i, its sum of exponentials
l_i = Σ_{j∈S_i} e^{s_j − m_i} and its partial output O_i = Σ_{j∈S_i} e^{s_j − m_i} v_j / l_i: a full
head_dim vector. The merge rescales to a common maximum m = max_i m_i with weights
w_i = l_i · e^{m_i − m} and averages: O = Σ_i w_i O_i / Σ_i w_i. An empty (or fully masked) split
has l_i = 0, so weight 0. The result equals unsplit attention: a weighted average, not a concatenation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from engine.trace import SplitKVTrace


@dataclass
class Partials:
    """Per split: shapes (..., S) for max_score and exp_sum, (..., S, D) for output."""

    max_score: torch.Tensor  # m_i, −inf for an empty split
    exp_sum: torch.Tensor  # l_i, 0 for an empty split
    output: torch.Tensor  # O_i, zeros for an empty split


@dataclass
class Merged:
    output: torch.Tensor  # (..., D)
    weight: torch.Tensor  # (..., S): w_i / Σ w, each split's share of the result


def split_ranges(length: int, splits: int) -> list[tuple[int, int]]:
    """`splits` contiguous [start, end) ranges of ceil(length / splits) keys; trailing ones may be empty."""
    chunk = split_width(length, splits)
    return [(min(i * chunk, length), min((i + 1) * chunk, length)) for i in range(splits)]


def split_width(length: int, splits: int) -> int:
    """Keys per split: ceil(length / splits), at least 1."""
    return max(1, math.ceil(length / splits))


def partials(scores: torch.Tensor, v: torch.Tensor, ranges: list[tuple[int, int]]) -> Partials:
    """scores (..., T, L), scaled and −inf where masked; v (..., L, D) broadcastable to them.

    Every split's values for every query: (..., T, S[, D]). Fine for one query row or a worked example;
    a whole prefill merges with `merge_online`, whose memory does not grow with S.
    """
    parts = [
        _normalised(*_group_sums(scores, v, start, end - start, 1)) if end > start else _empty_partial(scores, v)
        for start, end in ranges
    ]
    return _cat(parts)


def _empty_partial(scores: torch.Tensor, v: torch.Tensor) -> Partials:
    """A split with no keys: m_i = −inf, l_i = 0, O_i = 0; shapes (..., T, 1[, D])."""
    shape = torch.broadcast_shapes(scores.shape[:-1], v.shape[:-2] + (1,))  # (..., T)
    m = torch.full((*shape, 1), float("-inf"), dtype=scores.dtype, device=scores.device)
    return Partials(m, torch.zeros_like(m), torch.zeros((*shape, 1, v.shape[-1]), dtype=v.dtype, device=v.device))


def _cat(parts: list[Partials]) -> Partials:
    """Partials of consecutive groups of splits, joined along the split axis."""
    return Partials(
        *(
            torch.cat([getattr(p, name) for p in parts], dim=dim)
            for name, dim in (("max_score", -1), ("exp_sum", -1), ("output", -2))
        )
    )


def merge(p: Partials) -> Merged:
    m = p.max_score.amax(dim=-1, keepdim=True)
    w = p.exp_sum * torch.exp(p.max_score - m)  # e^{−inf} = 0 for empty splits
    total = w.sum(dim=-1, keepdim=True)
    share = w / total
    return Merged(output=(share[..., None] * p.output).sum(dim=-2), weight=share)


MAX_KV_SPLITS = 256  # a step's time grows with the split count (its memory does not); more teaches nothing
SPLIT_GROUP_ELEMENTS = 1 << 20  # partial outputs computed at once by `merge_online`: 4 MB in float32


def merge_online(scores: torch.Tensor, v: torch.Tensor, splits: int) -> tuple[torch.Tensor, Partials]:
    """The merge of `merge` over the `split_ranges(L, splits)` splits, for every query row, in memory
    independent of S.

    scores (..., T, L), v (..., L, D) as for `partials`. Splits are taken a group at a time (as many as
    keep the group's partial outputs within SPLIT_GROUP_ELEMENTS: all of them for one decode row, a
    few for a long prefill), and merged into running sums: the same w_i = l_i e^{m_i − m} and
    O = Σ w_i O_i / Σ w_i, where, when the maximum rises from M to M', the sums so far are rescaled by
    e^{M − M'}, so at the end every w_i is taken against m = max_i m_i. (w_i O_i is taken as
    e^{m_i − M} · l_i O_i, and l_i O_i = Σ_{j∈S_i} e^{s_j − m_i} v_j is what a split sums before dividing.)
    Returns the merged output (..., T, D) and the last row's partials (..., S[, D]): what a trace keeps.
    """
    length = scores.shape[-1]
    width = split_width(length, splits)
    per_split = scores[..., 0].numel() * v.shape[-1]  # elements of one split's partial outputs
    group = max(1, min(splits, SPLIT_GROUP_ELEMENTS // max(1, per_split)))
    running_max = weight_sum = output_sum = None
    last = []
    for first in range(0, splits, group):
        m, exp_sum, raw = _group_sums(scores, v, first * width, width, min(group, splits - first))  # (..., T, G[, D])
        # Copies, not views: a view of the last row would keep the group's whole (..., T, G, D) alive.
        last.append(_normalised(m[..., -1, :].clone(), exp_sum[..., -1, :].clone(), raw[..., -1, :, :].clone()))
        new_max = m.amax(dim=-1) if running_max is None else torch.maximum(running_max, m.amax(dim=-1))
        safe = _finite_or_zero(new_max)  # all −inf: nothing visible yet, every weight is 0
        scale = torch.exp(m - safe[..., None])  # (..., T, G): e^{m_i − M'}
        weighted = torch.matmul(scale.unsqueeze(-2), raw).squeeze(-2)  # (..., T, D): Σ_i e^{m_i − M'} l_i O_i
        if running_max is None:
            weight_sum, output_sum = (exp_sum * scale).sum(dim=-1), weighted
        else:
            rescale = torch.exp(running_max - safe)  # e^{M − M'}
            weight_sum = weight_sum * rescale + (exp_sum * scale).sum(dim=-1)
            output_sum = output_sum * rescale[..., None] + weighted
        running_max = new_max
    merged = output_sum / weight_sum.clamp_min(torch.finfo(weight_sum.dtype).tiny)[..., None]
    return merged, _cat(last)


def _group_sums(
    scores: torch.Tensor, v: torch.Tensor, start: int, width: int, count: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`count` consecutive splits of `width` keys from `start` at once: m_i, l_i (..., T, G) and the
    unnormalised l_i O_i = Σ_{j∈S_i} e^{s_j − m_i} v_j (..., T, G, D).

    Keys past the end are padded as masked (score −inf, value 0), so a trailing split is short or
    empty exactly as `split_ranges` makes it.
    """
    start = min(start, scores.shape[-1])  # a group past the last key: all its splits are empty
    end = min(start + width * count, scores.shape[-1])
    pad = width * count - (end - start)
    s = torch.nn.functional.pad(scores[..., start:end], (0, pad), value=float("-inf")).unflatten(-1, (count, width))
    values = torch.nn.functional.pad(v[..., start:end, :], (0, 0, 0, pad)).unflatten(-2, (count, width))
    m = s.amax(dim=-1)  # (..., T, G)
    e = torch.exp(s - _finite_or_zero(m)[..., None])  # a fully masked split: every e^s is 0
    # (..., G, T, W) @ (..., G, W, D) → (..., G, T, D), then back to (..., T, G, D)
    raw = torch.matmul(e.transpose(-3, -2), values).transpose(-3, -2)
    return m, e.sum(dim=-1), raw


def _normalised(m: torch.Tensor, exp_sum: torch.Tensor, raw: torch.Tensor) -> Partials:
    """O_i = raw_i / l_i (0 for an empty or fully masked split, whose l_i is 0)."""
    output = torch.where(
        exp_sum[..., None] > 0,
        raw / exp_sum.clamp_min(torch.finfo(exp_sum.dtype).tiny)[..., None],
        torch.zeros_like(raw),
    )
    return Partials(m, exp_sum, output)


def _finite_or_zero(m: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isfinite(m), m, torch.zeros_like(m))


DEMO_SPLITS = 4  # splits of the demonstration replayed over a recorded row when the run itself is unsplit


def split_demo(scores: torch.Tensor, v: torch.Tensor, splits: int = DEMO_SPLITS) -> SplitKVTrace:
    """Split-KV replayed on one query row a step recorded, without another forward pass.

    scores (L,): the row's scaled scores, −inf where masked; v (L, D): the cached V of its K/V head.
    Computed in float64 by the same `split_ranges`, `partials` and `merge` as the engine. Returns a
    `SplitKVTrace` with one layer and one head (leading axes (1, 1)); its `unsplit` is softmax(scores) @ v.
    """
    s, values = scores.detach().double().cpu(), v.detach().double().cpu()
    ranges = split_ranges(s.shape[-1], splits)
    p = partials(s[None], values, ranges)  # (1, S[, D]): one query row
    merged = merge(p)
    unsplit = torch.softmax(s, dim=-1) @ values
    return SplitKVTrace(
        ranges=ranges,
        max_score=p.max_score[None],
        exp_sum=p.exp_sum[None],
        partial=p.output[None],
        weight=merged.weight[None],
        merged=merged.output[None],
        unsplit=unsplit[None, None],
    )


@dataclass
class WorkedExample:
    """A small split-KV example in the spirit of the source article: one query, 2-D values, two splits."""

    query: list[float]
    keys: list[list[float]]
    values: list[list[float]]
    scores: list[float]  # q·k / √d
    ranges: list[tuple[int, int]]
    max_score: list[float]
    exp_sum: list[float]
    partial: list[list[float]]
    weight: list[float]
    merged: list[float]
    unsplit: list[float]


EXAMPLE_QUERY = [1.0, 2.0]
EXAMPLE_KEYS = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.5]]
EXAMPLE_VALUES = [[1.0, 0.0], [2.0, 1.0], [0.5, -1.0], [3.0, 2.0]]


def worked_example(splits: int = 2) -> WorkedExample:
    """Computed in float64 by the same `partials` and `merge` the engine runs."""
    q = torch.tensor(EXAMPLE_QUERY, dtype=torch.float64)
    k = torch.tensor(EXAMPLE_KEYS, dtype=torch.float64)
    v = torch.tensor(EXAMPLE_VALUES, dtype=torch.float64)
    scores = (k @ q) / math.sqrt(q.shape[0])
    ranges = split_ranges(len(EXAMPLE_KEYS), splits)
    p = partials(scores[None], v, ranges)
    merged = merge(p)
    unsplit = torch.softmax(scores, dim=-1) @ v
    return WorkedExample(
        query=EXAMPLE_QUERY,
        keys=EXAMPLE_KEYS,
        values=EXAMPLE_VALUES,
        scores=scores.tolist(),
        ranges=ranges,
        max_score=p.max_score[0].tolist(),
        exp_sum=p.exp_sum[0].tolist(),
        partial=p.output[0].tolist(),
        weight=merged.weight[0].tolist(),
        merged=merged.output[0].tolist(),
        unsplit=unsplit.tolist(),
    )

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
    chunk = max(1, math.ceil(length / splits))
    return [(min(i * chunk, length), min((i + 1) * chunk, length)) for i in range(splits)]


def partials(scores: torch.Tensor, v: torch.Tensor, ranges: list[tuple[int, int]]) -> Partials:
    """scores (..., T, L), scaled and −inf where masked; v (..., L, D) broadcastable to them."""
    maxes, sums, outputs = [], [], []
    for start, end in ranges:
        s = scores[..., start:end]
        if end == start:
            m = torch.full(s.shape[:-1], float("-inf"), dtype=s.dtype, device=s.device)
        else:
            m = s.amax(dim=-1)
        safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # a fully masked split: every e^s is 0
        e = torch.exp(s - safe[..., None])
        l = e.sum(dim=-1)
        o = torch.matmul(e, v[..., start:end, :])
        o = torch.where(l[..., None] > 0, o / l.clamp_min(torch.finfo(l.dtype).tiny)[..., None], torch.zeros_like(o))
        maxes.append(m)
        sums.append(l)
        outputs.append(o)
    return Partials(torch.stack(maxes, dim=-1), torch.stack(sums, dim=-1), torch.stack(outputs, dim=-2))


def merge(p: Partials) -> Merged:
    m = p.max_score.amax(dim=-1, keepdim=True)
    w = p.exp_sum * torch.exp(p.max_score - m)  # e^{−inf} = 0 for empty splits
    total = w.sum(dim=-1, keepdim=True)
    share = w / total
    return Merged(output=(share[..., None] * p.output).sum(dim=-2), weight=share)


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
        query=EXAMPLE_QUERY, keys=EXAMPLE_KEYS, values=EXAMPLE_VALUES, scores=scores.tolist(), ranges=ranges,
        max_score=p.max_score[0].tolist(), exp_sum=p.exp_sum[0].tolist(), partial=p.output[0].tolist(),
        weight=merged.weight[0].tolist(), merged=merged.output[0].tolist(), unsplit=unsplit.tolist(),
    )

"""Eviction policies, each as NVIDIA kvpress 0.5.5 defines it: a score per (KV head, cached row), the
highest `n_kept` rows kept.

A layer's cache is a list of rows per KV head (at first row i = position i; after an eviction, the rows kept,
in the order the selection returned them). Every policy scores those rows from two things:
  keys  (kv_heads, n, D)        the rows' keys, as cached (rotated at their own positions);
  probs (kv_heads, group, r, n) the last r queries' attention over the rows, the Q heads of each KV head
                                together (Q head h = kv_head × group + g, as transformers' repeat_kv).

- streaming_llm: 1 for the first `n_sink` rows and the last n_kept − n_sink rows, 0 between: sinks plus a window.
- knorm: −‖k‖ (the smallest key norms are kept).
- keydiff: −cos(k, anchor), the anchor the mean of the rows' unit keys (the keys least like the rest are kept).
- snapkv: the last `window_size` queries' attention on the rows before them, averaged over those queries,
  smoothed by a mean over `kernel_size` neighbours (zero-padded at the ends), averaged over the group's Q heads;
  the window's own rows score max + 1, so they always stay.
- tova: the last query's attention, averaged over all Q heads (one score shared by every KV head); the last
  row scores max + 1.
- observed_attention (H2O-like): each row's attention summed over the queries, divided by n − i (how many of
  a causal prefill's queries see row i), averaged over the group.
- pyramidkv: SnapKV's scores, and a budget per layer instead of one for all: PyramidKV's linear pyramid from the
  first layer (most) to the last (least), its total the ratio's, with `window_size` and `beta` shaping it (where
  the pyramid cannot hold, every layer keeps round(n × (1 − ratio)), as kvpress falls back).
- adakv (AdaKV around SnapKV, the paper's Ada-SnapKV): SnapKV's scores, the layer's budget shared by its KV heads:
  each head first keeps its top `alpha_safeguard` share of the ratio's count, then the lowest scores of the whole
  layer are evicted, so a head whose attention is concentrated gives its rows to one whose attention is spread.
- lagkv: no attention: the rows after the first `n_sink` cut into partitions of `lag_size`, each row scored by how
  far its key and value stand out (the std over channels, min-max scaled by the next partition's range), ranked
  within its partition; the last partition and the sinks always kept. Shorter than n_sink + 2 × lag_size: a
  ramp, the latest rows kept (a window).
- expected_attention: no attention matrix either: the softmax a future query would give each row, the queries
  modelled by the mean and covariance of the ones that ran (before RoPE, then turned by the rotation averaged over
  the next `n_future_positions` positions), times the row's value norm; the first `n_sink` rows always kept.

The scores depend on row order only where kvpress's do (the slices above are by row); `select` keeps the
top rows with torch's top-k, so the order of what stays is the one kvpress's cache holds. AdaKV keeps every row and
hides the evicted ones per head (`select_per_head`), as kvpress masks them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.checks import require_integer, require_number
from engine.errors import InvalidSettingError

EVICTION_POLICIES = (
    "streaming_llm",
    "knorm",
    "keydiff",
    "snapkv",
    "tova",
    "observed_attention",
    "pyramidkv",
    "adakv",
    "lagkv",
    "expected_attention",
)
SNAPKV_SCORES = ("snapkv", "pyramidkv", "adakv")  # the policies that score as SnapKV does
PREFILL_ONLY = ("pyramidkv", "adakv")  # budgets per layer or per head of a prefill's ratio


def n_kept_for_ratio(n: int, compression_ratio: float) -> int:
    """Rows kept out of `n` at a compression ratio, rounded down as kvpress does: int(n × (1 − ratio))."""
    return int(n * (1 - compression_ratio))


@dataclass(frozen=True)
class Policy:
    """One eviction policy and its parameters (kvpress's defaults)."""

    name: str
    n_sink: int = 4  # streaming_llm, lagkv, expected_attention
    window_size: int = 64  # snapkv, pyramidkv, adakv
    kernel_size: int = 5  # snapkv, pyramidkv, adakv (odd: the pooled scores keep one per row)
    beta: int = 20  # pyramidkv: how steep the pyramid is
    alpha_safeguard: float = 0.2  # adakv: the share of the count every head keeps at least
    lag_size: int = 128  # lagkv
    n_future_positions: int = 512  # expected_attention

    def __post_init__(self):
        if self.name not in EVICTION_POLICIES:
            raise InvalidSettingError(
                f"unknown eviction policy {self.name!r}; the policies are {', '.join(EVICTION_POLICIES)}"
            )
        require_integer("n_sink", self.n_sink, 0)
        for name in ("window_size", "kernel_size", "beta", "lag_size", "n_future_positions"):
            require_integer(name, getattr(self, name), 1)
        require_number(
            "alpha_safeguard",
            self.alpha_safeguard,
            0,
            1,
            why=" (the share of the ratio's count every head keeps at least)",
        )
        if self.kernel_size % 2 == 0:
            raise InvalidSettingError(
                f"kernel_size must be odd (one pooled score per position), got {self.kernel_size}"
            )

    def query_rows(self, n: int) -> int:
        """How many of the last queries' attention rows the score reads when `n` queries ran (0: none)."""
        if self.name in SNAPKV_SCORES:
            return min(n, self.window_size)
        return {"observed_attention": n, "tova": 1}.get(self.name, 0)

    @property
    def reads_values(self) -> bool:
        return self.name in ("lagkv", "expected_attention")

    @property
    def reads_queries(self) -> bool:
        """Whether the score reads the queries themselves (before RoPE), not their attention."""
        return self.name == "expected_attention"

    def check_rows(self, n: int, queries: int) -> None:
        """Raise unless `n` cached rows (scored from `queries` query rows) are enough for this policy."""
        if self.name in ("streaming_llm", "expected_attention") and n <= self.n_sink:
            raise InvalidSettingError(
                f"{self.name} keeps {self.n_sink} sink positions: the cache must hold more "
                f"than that to evict any, it holds {n}"
            )
        if self.name in SNAPKV_SCORES and queries <= self.window_size:
            raise InvalidSettingError(
                f"{self.name} scores by the last {self.window_size} queries (window_size): "
                f"more than that must have run since the last eviction, {queries} did"
            )
        if n < 2:
            raise InvalidSettingError(f"eviction needs at least 2 cached positions, the cache holds {n}")

    def layer_budget(self, n: int, compression_ratio: float, layer: int, layers: int) -> int:
        """Rows layer `layer` of `layers` keeps of `n` at `compression_ratio`: the ratio's count, or PyramidKV's
        pyramid (kvpress's formula, from KVCache-Factory: the first layer keeps the most, the budgets fall
        linearly and total n × (1 − ratio) per layer on average; round(), as kvpress rounds)."""
        if self.name != "pyramidkv":
            return n_kept_for_ratio(n, compression_ratio)
        w = self.window_size
        spare = n * (1 - compression_ratio)  # max_capacity_prompt − window_size
        least = spare / self.beta
        most = spare * 2 - least
        if most >= n - w:
            most = n - w
            least = spare * 2 - most
        if not n >= most >= least >= w:  # no pyramid fits: one count for every layer
            return max(1, round(n * (1 - compression_ratio)))
        step = (most - least) / (layers - 1) if layers > 1 else 0.0
        return round(most - layer * step)

    def score(self, layer: LayerInputs, n_kept: int) -> torch.Tensor:
        """(kv_heads, n): higher is kept. See the module docstring for each policy."""
        keys, probs = layer.keys, layer.probs
        kv_heads, n, _ = keys.shape
        if self.name == "streaming_llm":
            scores = torch.ones(kv_heads, n, dtype=keys.dtype, device=keys.device)
            scores[:, self.n_sink : self.n_sink + n - n_kept] = 0
            return scores
        if self.name == "knorm":
            return -keys.norm(dim=-1)
        if self.name == "keydiff":
            anchor = F.normalize(keys, p=2, dim=-1).mean(dim=1, keepdim=True)  # (kv_heads, 1, D)
            return -F.cosine_similarity(keys, anchor, dim=-1)
        if self.name in SNAPKV_SCORES:
            w = self.window_size
            seen = probs[:, :, -w:, : n - w].mean(dim=-2)  # (kv_heads, group, n − w)
            pooled = F.avg_pool1d(seen, kernel_size=self.kernel_size, padding=self.kernel_size // 2, stride=1)
            scores = pooled.mean(dim=1)
            return F.pad(scores, (0, w), value=scores.max().item() + 1)
        if self.name == "tova":
            last = probs[:, :, -1, : n - 1].reshape(-1, n - 1).mean(dim=0)  # over every Q head
            scores = last.expand(kv_heads, n - 1)
            return F.pad(scores, (0, 1), value=scores.max().item() + 1)
        if self.name == "lagkv":
            return _lag_scores(keys, layer.values, self.n_sink, self.lag_size)
        if self.name == "expected_attention":
            return self._expected_attention(layer)
        # observed_attention
        seen_by = torch.arange(n, 0, -1, dtype=probs.dtype, device=probs.device)
        return (probs.sum(dim=2) / seen_by).mean(dim=1)

    def _expected_attention(self, layer: LayerInputs) -> torch.Tensor:
        """kvpress's ExpectedAttentionPress, its shapes kept (a batch of one) so its sums run in the same order."""
        s = self.n_sink
        keys, values = layer.keys[None, :, s:], layer.values[None, :, s:]  # (1, kv_heads, n − s, D)
        queries = layer.queries[None, :, s:]  # (1, q_heads, t − s, D), before RoPE
        mean = queries.mean(dim=2, keepdim=True)
        centred = queries - mean
        cov = torch.einsum("bnsi,bnsj->bnij", centred, centred) / queries.shape[2]
        cos, sin = layer.future_rope  # (n_future_positions, D): the rotation at each future position
        d = cos.shape[1]
        swap = torch.zeros((d, d), dtype=cos.dtype)
        swap[d // 2 :, : d // 2], swap[: d // 2, d // 2 :] = torch.eye(d // 2), -torch.eye(d // 2)
        turn = (cos.unsqueeze(1) * torch.eye(d, dtype=cos.dtype) + sin.unsqueeze(1) * swap).mean(dim=0)
        mean = torch.matmul(mean.squeeze(2), turn.T)
        cov = torch.matmul(turn, torch.matmul(cov, turn.T))
        group = queries.shape[1] // keys.shape[1]
        by_q_head = keys.repeat_interleave(group, dim=1).transpose(2, 3)  # (1, q_heads, D, n − s)
        scores = torch.matmul(mean.unsqueeze(2), by_q_head).squeeze(2) / math.sqrt(d)
        scores += torch.einsum("bhin, bhij, bhjn->bhn", by_q_head, cov, by_q_head) / d / 2
        scores = F.softmax(scores, dim=-1)
        scores = scores.view(1, keys.shape[1], group, -1).mean(dim=2) * values.norm(dim=-1)
        return F.pad(scores, (s, 0), value=scores.max().item() + 1)[0]


@dataclass
class LayerInputs:
    """What a policy may read of one layer to score its rows, by row (the order `LayerRows` holds them in)."""

    keys: torch.Tensor  # (kv_heads, n, D), as cached (rotated at their own positions)
    probs: torch.Tensor | None = None  # (kv_heads, group, r, n): the last r queries' attention over the rows
    values: torch.Tensor | None = None  # (kv_heads, n, D): lagkv, expected_attention
    queries: torch.Tensor | None = None  # (q_heads, t, D): the scoring passes' queries before RoPE
    future_rope: tuple[torch.Tensor, torch.Tensor] | None = None  # cos, sin (n_future_positions, D) after them


def _lag_scores(keys: torch.Tensor, values: torch.Tensor, n_sink: int, lag: int) -> torch.Tensor:
    """LagKV's scores (kv_heads, n): see the module docstring."""
    kv_heads, n, d = keys.shape
    if n < n_sink + 2 * lag:
        scores = torch.ones(kv_heads, n, dtype=keys.dtype, device=keys.device)
        if n > n_sink:
            scores[:, n_sink:] = (torch.arange(n - n_sink, device=keys.device) / (n - n_sink)).to(keys.dtype)
        return scores
    end = n_sink + (n - n_sink) // lag * lag

    def stand_out(rows: torch.Tensor) -> torch.Tensor:  # (kv_heads, parts, lag, D) → (kv_heads, parts − 1, lag)
        reference, scored = rows[:, 1:], rows[:, :-1]
        low, high = reference.min(dim=-2, keepdim=True).values, reference.max(dim=-2, keepdim=True).values
        return ((scored - low) / (high - low)).std(dim=-1).softmax(dim=-1)

    parts = (
        stand_out(keys[:, n_sink:end].reshape(kv_heads, -1, lag, d))
        + stand_out(values[:, n_sink:end].reshape(kv_heads, -1, lag, d))
    ) / 2
    ranks = (parts.argsort(dim=-1).argsort(dim=-1) / lag).to(keys.dtype)  # within each partition
    ones = lambda count: torch.ones(kv_heads, count, dtype=keys.dtype, device=keys.device)  # noqa: E731
    return torch.cat((ones(n_sink), ranks.reshape(kv_heads, -1), ones(lag + n - end)), dim=-1)


def select(scores: torch.Tensor, n_kept: int) -> torch.Tensor:
    """(kv_heads, n_kept): the rows with the highest scores, per KV head, in top-k's order (kvpress's cache order).
    Top-k runs on a batch of one, the shape kvpress hands it, so ties fall the same way."""
    return scores.unsqueeze(0).topk(n_kept, dim=-1).indices[0]


def select_per_head(scores: torch.Tensor, n_kept: int, alpha_safeguard: float) -> torch.Tensor:
    """(kv_heads, n) bool, AdaKV's: True at the rows kept. Each head's top int(n_kept × alpha) rows (at least one)
    are kept first; of the rest, the layer's kv_heads × (n − n_kept) lowest scores, over all heads at once, go."""
    kv_heads, n = scores.shape
    scores = scores.unsqueeze(0).clone()
    n_safe = int(n_kept * alpha_safeguard)
    if alpha_safeguard > 0:
        n_safe = max(1, n_safe) if n_kept > 0 else 0
    scores.scatter_(-1, scores.topk(n_safe, dim=-1).indices, torch.finfo(scores.dtype).max)
    evicted = (-scores.reshape(1, -1)).topk(kv_heads * (n - n_kept), dim=1).indices.flatten()
    held = torch.ones(kv_heads * n, dtype=torch.bool, device=scores.device)
    held[evicted] = False
    return held.view(kv_heads, n)

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

The scores depend on row order only where kvpress's do (the slices above are by row); `select` keeps the
top rows with torch's top-k, so the order of what stays is the one kvpress's cache holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.errors import InvalidSettingError

POLICIES = ("streaming_llm", "knorm", "keydiff", "snapkv", "tova", "observed_attention")


def n_kept_for_ratio(n: int, compression_ratio: float) -> int:
    """Rows kept out of `n` at a compression ratio, rounded down as kvpress does: int(n × (1 − ratio))."""
    return int(n * (1 - compression_ratio))


def check_ratio(compression_ratio: float) -> None:
    if isinstance(compression_ratio, bool) or not isinstance(compression_ratio, (int, float)) \
            or not 0 <= compression_ratio < 1:
        raise InvalidSettingError(f"the compression ratio is the share of positions evicted, from 0 up to (not "
                                  f"including) 1; got {compression_ratio!r}")


def _positive_int(name: str, value, least: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise InvalidSettingError(f"{name} must be an integer ≥ {least}, got {value!r}")


@dataclass(frozen=True)
class Policy:
    """One eviction policy and its parameters (kvpress's defaults)."""

    name: str
    n_sink: int = 4  # streaming_llm
    window_size: int = 64  # snapkv
    kernel_size: int = 5  # snapkv (odd: the pooled scores keep one per row)

    def __post_init__(self):
        if self.name not in POLICIES:
            raise InvalidSettingError(f"unknown eviction policy {self.name!r}; the policies are {', '.join(POLICIES)}")
        _positive_int("n_sink", self.n_sink, least=0)
        _positive_int("window_size", self.window_size)
        _positive_int("kernel_size", self.kernel_size)
        if self.kernel_size % 2 == 0:
            raise InvalidSettingError(f"kernel_size must be odd (one pooled score per position), "
                                      f"got {self.kernel_size}")

    def query_rows(self, n: int) -> int:
        """How many of the last queries' attention rows the score reads when `n` queries ran (0: none)."""
        return {"observed_attention": n, "snapkv": min(n, self.window_size), "tova": 1}.get(self.name, 0)

    def check_rows(self, n: int, queries: int) -> None:
        """Raise unless `n` cached rows (scored from `queries` query rows) are enough for this policy."""
        if self.name == "streaming_llm" and n <= self.n_sink:
            raise InvalidSettingError(f"streaming_llm keeps {self.n_sink} sink positions: the cache must hold more "
                                      f"than that to evict any, it holds {n}")
        if self.name == "snapkv" and queries <= self.window_size:
            raise InvalidSettingError(f"snapkv scores by the last {self.window_size} queries (window_size): more "
                                      f"than that must have run since the last eviction, {queries} did")
        if n < 2:
            raise InvalidSettingError(f"eviction needs at least 2 cached positions, the cache holds {n}")

    def score(self, keys: torch.Tensor, probs: torch.Tensor | None, n_kept: int) -> torch.Tensor:
        """(kv_heads, n): higher is kept. See the module docstring for each policy."""
        kv_heads, n, _ = keys.shape
        if self.name == "streaming_llm":
            scores = torch.ones(kv_heads, n, dtype=keys.dtype, device=keys.device)
            scores[:, self.n_sink:self.n_sink + n - n_kept] = 0
            return scores
        if self.name == "knorm":
            return -keys.norm(dim=-1)
        if self.name == "keydiff":
            anchor = F.normalize(keys, p=2, dim=-1).mean(dim=1, keepdim=True)  # (kv_heads, 1, D)
            return -F.cosine_similarity(keys, anchor, dim=-1)
        if self.name == "snapkv":
            w = self.window_size
            seen = probs[:, :, -w:, :n - w].mean(dim=-2)  # (kv_heads, group, n − w)
            pooled = F.avg_pool1d(seen, kernel_size=self.kernel_size, padding=self.kernel_size // 2, stride=1)
            scores = pooled.mean(dim=1)
            return F.pad(scores, (0, w), value=scores.max().item() + 1)
        if self.name == "tova":
            last = probs[:, :, -1, :n - 1].reshape(-1, n - 1).mean(dim=0)  # over every Q head
            scores = last.expand(kv_heads, n - 1)
            return F.pad(scores, (0, 1), value=scores.max().item() + 1)
        # observed_attention
        seen_by = torch.arange(n, 0, -1, dtype=probs.dtype, device=probs.device)
        return (probs.sum(dim=2) / seen_by).mean(dim=1)


def select(scores: torch.Tensor, n_kept: int) -> torch.Tensor:
    """(kv_heads, n_kept): the rows with the highest scores, per KV head, in top-k's order (kvpress's cache order).
    Top-k runs on a batch of one, the shape kvpress hands it, so ties fall the same way."""
    return scores.unsqueeze(0).topk(n_kept, dim=-1).indices[0]

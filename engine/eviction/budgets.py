"""How far decoding lets the cache grow before it evicts: kvpress's DecodingPress (a `DecodeBudget`, scored every
`interval` passes) or StreamingLLM's streaming form (a `StreamingWindow`, kept by position after every pass)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.checks import require_integer
from engine.eviction.rows import LayerRows

HIDDEN_STATES_BUFFER = 256  # DecodingPress's default: how many of the latest passes it scores from, at most


@dataclass(frozen=True)
class DecodeBudget:
    """kvpress's DecodingPress: every `interval` decode passes, compress each (layer, KV head) to `target_size`."""

    target_size: int
    interval: int = 512

    def __post_init__(self):
        for name in ("target_size", "interval"):
            require_integer(f"the decode budget's {name}", getattr(self, name), 1)


@dataclass(frozen=True)
class StreamingWindow:
    """StreamingLLM's streaming form: after every pass keep the first `n_sink` positions and the latest `window`."""

    n_sink: int = 4
    window: int = 60

    def __post_init__(self):
        for name, least in (("n_sink", 0), ("window", 1)):
            require_integer(f"the streaming window's {name}", getattr(self, name), least)

    def keep(self, positions: torch.Tensor) -> torch.Tensor | None:
        """The rows each KV head keeps of rows holding `positions` (kv_heads, n): the `n_sink` with the first
        positions and the latest `window`, (kv_heads, n_sink + window); None while n is no more than that."""
        if positions.shape[1] <= self.n_sink + self.window:
            return None
        order = positions.argsort(dim=1)  # rows by position
        return torch.cat((order[:, : self.n_sink], order[:, -self.window :]), dim=1)

    def sink_turns(self, length: int) -> torch.Tensor:
        """(length,) long: how far the pass at position p moves the sinks up when positions are numbered inside the
        cache (the StreamingLLM paper's): the sinks at 0 … n_sink − 1, then the window it reads, with no gap.
        It reads the latest window + 1 positions p − window … p; they start right after the sinks once
        p − window > n_sink."""
        return (torch.arange(length) - self.window - self.n_sink).clamp(min=0)

    def reads(self, length: int) -> torch.Tensor:
        """(length, length) bool: row p is what the pass at position p reads when the window streams from
        position 0 (each pass appends its position, reads, then `keep`s): a teacher-forced pass over many
        positions masks each query with its row (`engine.eviction.nll`)."""
        rows = LayerRows(1, 0, torch.device("cpu"))
        reads = torch.zeros(length, length, dtype=torch.bool)
        for p in range(length):
            rows.append(p, 1)
            reads[p] = rows.mask(length)[0]
            kept = self.keep(rows.positions)
            if kept is not None:
                rows.keep(kept)
        return reads

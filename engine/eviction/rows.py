"""What one layer's cache holds after eviction: for each KV head, the positions of its rows, in row order.

The K/V stay where the paged cache wrote them, each rotated at its own position (as kvpress keeps them; the
StreamingLLM paper instead re-numbers positions inside the cache). Attention reads a mask built from the
rows (`mask`), so evicted positions are masked, not freed: `engine.eviction.run` counts both the bytes the
rows hold and the bytes the blocks under them take.
"""

from __future__ import annotations

import torch


class LayerRows:
    """positions: (kv_heads, n) long; row i of KV head h holds position positions[h, i]. `held` (kv_heads, n)
    bool, once AdaKV has evicted: which rows each head still reads (its heads keep different counts, so the rows
    stay and the evicted ones are hidden, as kvpress masks them); None while every row is read."""

    def __init__(self, kv_heads: int, length: int, device: torch.device):
        self.positions = torch.arange(length, device=device).expand(kv_heads, length).clone()
        self.held: torch.Tensor | None = None

    @property
    def count(self) -> int:
        """Rows each KV head holds (all heads hold as many; with `held`, hidden rows included)."""
        return self.positions.shape[1]

    @property
    def counts(self) -> torch.Tensor:
        """(kv_heads,) the rows each head reads."""
        if self.held is None:
            return torch.full((self.positions.shape[0],), self.count)
        return self.held.sum(dim=1).cpu()

    def append(self, start: int, count: int) -> None:
        """New positions start … start + count − 1, appended to every head's rows."""
        kv_heads = self.positions.shape[0]
        new = torch.arange(start, start + count, device=self.positions.device)
        self.positions = torch.cat((self.positions, new.expand(kv_heads, count)), dim=1)
        if self.held is not None:
            self.held = torch.cat((self.held, self.held.new_ones(kv_heads, count)), dim=1)

    def keep(self, rows: torch.Tensor) -> None:
        """Keep rows (kv_heads, n_kept) of each head, in that order."""
        self.positions = self.positions.gather(1, rows)

    def hide(self, held: torch.Tensor) -> None:
        """Read only the rows `held` (kv_heads, n) bool marks, each head its own count (AdaKV)."""
        self.held = held

    def held_positions(self, kv_head: int) -> list[int]:
        """The positions KV head `kv_head` reads, ascending."""
        positions = self.positions[kv_head]
        return sorted((positions if self.held is None else positions[self.held[kv_head]]).tolist())

    def mask(self, length: int) -> torch.Tensor:
        """(kv_heads, length) bool: True at the positions each head reads."""
        mask = torch.zeros(self.positions.shape[0], length, dtype=torch.bool, device=self.positions.device)
        return mask.scatter_(1, self.positions, True if self.held is None else self.held)

    def gather_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """keys (L, kv_heads, D) by position → (kv_heads, n, D) by row."""
        by_head = keys.permute(1, 0, 2)
        return by_head.gather(1, self.positions[:, :, None].expand(-1, -1, keys.shape[-1]))

    def gather_probs(self, probs: torch.Tensor) -> torch.Tensor:
        """probs (q_heads, r, L) by position → (kv_heads, group, r, n) by row of each Q head's KV head."""
        q_heads, r, _ = probs.shape
        kv_heads = self.positions.shape[0]
        grouped = probs.reshape(kv_heads, q_heads // kv_heads, r, -1)
        index = self.positions[:, None, None, :].expand(-1, grouped.shape[1], r, -1)
        return grouped.gather(3, index)

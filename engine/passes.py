"""A forward pass's part for one sequence: what a caller hands `Model.forward_batch` (`Pass`), and what every layer
of the pass shares for that sequence (`PassContext`, its paged K/V as `PagedKV`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.attention import AttentionResult
from engine.kv_cache import BlockPool, BlockTable
from engine.trace import Capture

Observer = Callable[[int, AttentionResult, torch.Tensor], None]  # (layer, its attention, its queries before RoPE)


@dataclass
class Pass:
    """One sequence's part of a (batched) forward pass: `Model.forward`'s arguments, less the batch's own."""

    ids: list[int]
    positions: list[int]
    table: BlockTable
    capture: Capture
    kv_splits: int = 1
    write: bool = True
    kept: list[torch.Tensor | None] | None = None
    observe: Observer | None = None
    # Re-rotated positions (kvpress's KeyRerotationPress): the positions the rows' q and k turn by, where they are
    # not `positions` (the cache slots they take and the causal mask's order), and per layer (kv_heads, n) the
    # turn of each of the first n cached keys as read (None: as written).
    rope_positions: list[int] | None = None
    key_turns: list[torch.Tensor | None] | None = None
    # StreamingLLM's positions inside the cache over a teacher-forced pass (`engine.eviction.nll`): the first s keys
    # (the sinks) read by each row turned on by its own turn (T,), on the layers that evict (`kept` not None).
    sink_turns: tuple[int, torch.Tensor] | None = None


@dataclass
class PagedKV:
    """One table's K/V in the pool as a pass sees it: its blocks, and where this pass's K/V go."""

    pool: BlockPool
    blocks: torch.Tensor  # (logical blocks held,) physical block of each
    slots: torch.Tensor | None  # (T,) flat slots for this pass's K/V; None: write nothing
    first_block: int | None  # the first block when the blocks are consecutive (read as a view)
    start: int  # the first position the blocks hold (past 0 once a sliding window handed blocks back)
    cached: int  # positions before this pass
    length: int  # positions attended: cached + T

    @classmethod
    def of(cls, table: BlockTable, positions: list[int], write: bool) -> PagedKV:
        return cls(
            table.pool,
            table.device_blocks(),
            table.slots_at(positions) if write else None,
            table.first_of_run(),
            table.first_position,
            positions[0],
            positions[-1] + 1,
        )

    def store_and_read(self, row: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this pass's k, v (T, kv_heads, D) for the pool's layer `row`; return K, V of positions
        `start` … length − 1 (L − start, kv_heads, D). Without slots, the cached positions are read and k, v
        appended in memory: the values a write then a read would give, with nothing written."""
        if self.slots is None:
            cached_k, cached_v = self.pool.read(row, self.blocks, self.cached - self.start, self.first_block)
            return torch.cat((cached_k, k)), torch.cat((cached_v, v))
        self.pool.write(row, self.slots, k, v)
        return self.pool.read(row, self.blocks, self.length - self.start, self.first_block)


@dataclass
class PassContext:
    """What every layer of a forward pass shares for one of its sequences."""

    rows: slice  # this sequence's rows of the batch
    positions: torch.Tensor  # (T,) the query positions
    cos_sin: dict[str, tuple[torch.Tensor, torch.Tensor]]  # RoPE's (T, head_dim) each, per layer kind; {} if learned
    kv: PagedKV  # the global layers' cache
    local_kv: PagedKV | None  # the sliding-window layers' cache
    kv_splits: int
    kept: list[torch.Tensor | None] | None = None  # per layer, what eviction left each KV head (None: all)
    key_turns: list[torch.Tensor | None] | None = None  # per layer, the cached keys' turns as read (`Pass`)
    sink_turns: tuple[int, torch.Tensor] | None = None  # (s, (T,)): each row's turn of the first s keys (`Pass`)
    observe: Observer | None = None  # sees each layer's attention result

"""One request in a pool that other requests used first: the engine's own allocator scatters its blocks.

A server keeps one KV pool for all its requests, and a block goes back to the free list when its request ends.
`BusyPoolReplay` recomputes a request's passes (its prefill over the whole prompt, then its decode steps, as
its run made them) in a fresh pool after this history: 2 × B short requests (B: the blocks the request needs)
arrived one after another and took one block each, the whole pool; every second one then finished and freed its
block. The block manager hands out free blocks in the order they were freed (engine.blocks, nano-vllm's order), so
the request's prompt lands on the first freed blocks between the others', and its decode steps on the next ones.
Its block table maps logical to scattered physical blocks, and attention reads the K/V through that table. Only the
other requests' blocks matter here (nothing reads their K/V), so they are taken without a forward pass; the
request's own passes are computed, one `add` a step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.kv_cache import BlockPool, BlockTable
from engine.model import Model
from engine.trace import NO_RECORD


@dataclass(frozen=True)
class BusyPoolPicture:
    """What a view draws of a replay: plain data."""

    block_table: list[int]  # the request's logical → physical blocks
    length: int  # its cached positions
    num_blocks: int  # the pool's
    # The other requests' (a replay's pictures share them: set once, before the request's first pass)
    others: dict[int, int]  # physical block → the other request (1-based) still holding it
    freed: list[int]  # blocks freed by the requests that finished, in the order they were freed
    kv_max_diff: float  # largest |difference| of the K/V read through the table from the run's own K/V

    @property
    def requests_before(self) -> int:
        """The short requests that used the pool before this one: those still holding a block, those that finished."""
        return len(self.others) + len(self.freed)


class BusyPoolReplay:
    """passes: (ids, positions) of the request's first passes in order, the first being the whole prompt;
    `capacity`: the positions it may reach with the passes `add`ed later (default: those of `passes`)."""

    def __init__(
        self, model: Model, passes: list[tuple[list[int], list[int]]], block_size: int, capacity: int | None = None
    ):
        self.model = model
        length = sum(len(ids) for ids, _ in passes) if capacity is None else capacity
        others = 2 * math.ceil(length / block_size)
        self.pool: BlockPool = model.new_pool(others, block_size)
        self.others: dict[int, int] = {}  # physical block → the other request (1-based) that still holds it
        self.freed: list[int] = []  # blocks of the requests that finished, in the order they were freed
        tables = [BlockTable(self.pool) for _ in range(others)]
        for table in tables:
            table.append(block_size)  # one block each, as a one-block prompt takes it
        for number, table in enumerate(tables, start=1):
            if number % 2 == 0:
                self.freed += table.blocks
                table.free()
            else:
                self.others.update({block: number for block in table.blocks})
        self.table = BlockTable(self.pool)
        for ids, positions in passes:
            self.add(ids, positions)

    def add(self, ids: list[int], positions: list[int]) -> None:
        """The request's next pass: its K/V written through its table, blocks past a sliding window handed back."""
        self.table.append(len(ids))
        self.model.forward(ids, positions, self.table, NO_RECORD)
        self.table.slide()

    @property
    def nbytes(self) -> int:
        return self.pool.num_blocks * self.pool.block_size * self.pool.bytes_per_token

    def kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The request's K and V of `layer` read through its scattered table: (n, kv_heads, head_dim) each, and
        the position they start at (a sliding-window layer holds only its last positions)."""
        return self.table.read(layer)

    def picture(self, own_kv: Callable[[int], tuple[torch.Tensor, torch.Tensor, int]]) -> BusyPoolPicture:
        """The replay as plain data; `own_kv(layer)` is what the run's own cache holds of its first `table.length`
        positions (K, V, their first position), which the K/V read through the scattered table are compared with
        at every position both hold, in every layer."""
        diff = 0.0
        for layer in range(self.model.info.layers):
            *mine, mine_start = self.kv(layer)
            *own, own_start = own_kv(layer)
            start = max(mine_start, own_start)
            for a, b in zip(mine, own):
                a, b = a[start - mine_start :], b[start - own_start :]
                if len(a):
                    diff = max(diff, (a.float() - b.float()).abs().max().item())
        return BusyPoolPicture(
            block_table=list(self.table.blocks),
            length=self.table.length,
            num_blocks=self.pool.num_blocks,
            others=self.others,
            freed=self.freed,
            kv_max_diff=diff,
        )

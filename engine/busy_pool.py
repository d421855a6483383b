"""One request in a pool that other requests used first: the engine's own allocator scatters its blocks.

A server keeps one KV pool for all its requests, and a block goes back to the free list when its request ends.
`BusyPoolReplay` recomputes a request's passes (its prefill over the whole prompt, then its decode steps, as
its run made them) in a fresh pool after this history: 2 × P short requests (P: the blocks the prompt needs)
arrived one after another and took one block each; every second one then finished and freed its block. The
pool hands out freed blocks first, the most recently freed first (`BlockPool.release`), so the request's
prompt lands on the freed blocks between the others', and its decode steps on the next free ones. Its block
table maps logical to scattered physical blocks, and attention reads the K/V through that table.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.kv_cache import BlockPool, BlockTable
from engine.model import Model
from engine.trace import Capture

NO_RECORD = Capture(attention=False, residuals=False)


@dataclass(frozen=True)
class BusyPoolPicture:
    """What a view draws of a replay: plain data."""

    block_table: list[int]  # the request's logical → physical blocks
    length: int  # its cached positions
    num_blocks: int  # the pool's
    others: dict[int, int]  # physical block → the other request (1-based) still holding it
    freed: list[int]  # blocks freed by the requests that finished, in the order they were freed
    kv_max_diff: float  # largest |difference| of the K/V read through the table from the run's own K/V

    @property
    def requests_before(self) -> int:
        """The short requests that used the pool before this one: those still holding a block, those that finished."""
        return len(self.others) + len(self.freed)


class BusyPoolReplay:
    """passes: (ids, positions) of each of the request's passes in order, the first being the whole prompt."""

    def __init__(self, model: Model, passes: list[tuple[list[int], list[int]]], block_size: int):
        self.model = model
        prompt = passes[0][0]
        length = sum(len(ids) for ids, _ in passes)
        others = 2 * math.ceil(len(prompt) / block_size)
        self.pool: BlockPool = model.new_pool(others + math.ceil(length / block_size) + 1, block_size)
        self.others: dict[int, int] = {}  # physical block → the other request (1-based) that still holds it
        self.freed: list[int] = []  # blocks of the requests that finished, in the order they were freed
        tables = [self._run(BlockTable(self.pool), _other_prompt(prompt, i, block_size)) for i in range(others)]
        for number, table in enumerate(tables, start=1):
            if number % 2 == 0:
                self.freed += table.blocks
                table.free()
            else:
                self.others.update({block: number for block in table.blocks})
        self.table = BlockTable(self.pool)
        for ids, positions in passes:
            self._pass(self.table, ids, positions)

    def _run(self, table: BlockTable, ids: list[int]) -> BlockTable:
        self._pass(table, ids, list(range(len(ids))))
        return table

    def _pass(self, table: BlockTable, ids: list[int], positions: list[int]) -> None:
        table.append(len(ids))
        self.model.forward(ids, positions, table, NO_RECORD)
        table.slide()

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
                a, b = a[start - mine_start:], b[start - own_start:]
                if len(a):
                    diff = max(diff, (a.float() - b.float()).abs().max().item())
        return BusyPoolPicture(block_table=list(self.table.blocks), length=self.table.length,
                               num_blocks=self.pool.num_blocks, others=dict(self.others), freed=list(self.freed),
                               kv_max_diff=diff)


def _other_prompt(prompt: list[int], number: int, block_size: int) -> list[int]:
    """Another request's prompt, one block long: `block_size` of this prompt's ids from position `number` on
    (wrapping), so each is a different real token sequence."""
    return [prompt[(number + i) % len(prompt)] for i in range(block_size)]

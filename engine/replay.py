"""A generation's past K/V, recomputed: what a sliding window handed back, for rebuilding an old step exactly.

A sliding-window layer hands its oldest blocks back to the pool as the sequence grows (`BlockTable.slide`), so a
step whose window reached further back than what the generation still holds cannot read its K/V from the generation's
cache. `Replay` computes them again: the generation's passes (its prefill, then its decode steps), in the same
order, on the same ids and positions and with the same split count, into a private pool whose window never
slides. The same passes compute the same K/V bit for bit (on one machine with the same torch thread count, as a
host's pages have: KVSCOPE_THREADS; a bfloat16 sum may round differently over another count); a local layer that
reads more positions than the generation's did reads them masked (probability 0), exactly as the generation read its
handed-back ones (zeros, masked): see `engine.attention.attend`. So a step rebuilt over a replay equals the step
the generation ran.

A prefill that reused a prefix from a prefix cache starts from those positions' K/V as the generation took them,
not recomputed: the generation's own global blocks (held until it closes) and a copy of the local layers' ones
taken at its prefill (`reused_window_kv`), since the window may hand those back too.

What it costs: one forward pass per replayed step (its layers only: no lm_head), once (a replay is extended, never
redone, as older steps are asked for), and the K/V of every replayed position in every layer, freed with the generation
(Gemma 3 270M: 18,432 B a position).
"""

from __future__ import annotations

import torch

from engine.kv_cache import BlockTable
from engine.model import Model
from engine.trace import NO_RECORD, StepTrace


def reused_window_kv(table: BlockTable, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Copies of what `table`'s sliding-window layers hold for positions 0 … length − 1 (a reused prefix, before
    any slid out of the window), one (K, V) pair of (length, kv_heads, head_dim) per row of the window pool."""
    window = table.window
    if window is None or not length:
        return []
    rows = window.pool.k.shape[0]
    return [
        tuple(x.clone() for x in window.pool.read(row, window.device_blocks(), length, window.first_of_run()))
        for row in range(rows)
    ]


class Replay:
    """Every layer's K/V of a generation's first passes, recomputed into a pool of its own (see the module)."""

    def __init__(self, model: Model, block_size: int, capacity: int, kv_splits: int):
        self.model = model
        self.kv_splits = kv_splits
        self.table = BlockTable(model.new_pool(-(-capacity // block_size), block_size))
        self.passes = 0  # the generation's passes replayed so far

    def start_from(
        self, generation_table: BlockTable, reused: int, window_kv: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> None:
        """Positions 0 … reused − 1 as a prefill after a prefix-cache hit took them: the global layers' K/V from the
        generation's table, the local layers' from `window_kv` (`reused_window_kv`)."""
        if not reused:
            return
        table, pool = self.table, self.table.pool
        table.append(reused)
        positions = list(range(reused))
        for layer in range(self.model.info.layers):
            local, row = pool.rows[layer]
            if local:
                k, v = window_kv[row]
                pool.window.write(row, table.window.slots_at(positions), k, v)
            else:
                k, v, _ = generation_table.read(layer, reused)
                pool.write(row, table.slots_at(positions), k, v)

    def run_to(self, traces: list[StepTrace], count: int) -> None:
        """Replay the generation's passes up to (not including) pass `count`: `traces` are the generation's."""
        for trace in traces[self.passes : count]:
            self.table.append(len(trace.input_ids))
            self.model.forward(
                trace.input_ids,
                trace.positions,
                self.table,
                NO_RECORD,
                self.kv_splits,
                head=False,
                prefill=trace.phase == "prefill",
            )
            self.passes += 1

    def table_before(self, trace: StepTrace) -> BlockTable:
        """A view of the replayed K/V as `trace`'s step found them (positions before its first), in the shape its
        forward pass reads (`write=False`): every layer from position 0. `run_to` must have replayed the passes
        before it."""
        size = self.table.pool.block_size
        held = -(-trace.context_length // size)
        view = BlockTable(self.table.pool, blocks=self.table.blocks[:held], length=trace.context_length)
        if view.window is not None:
            view.window = BlockTable(
                view.window.pool, blocks=self.table.window.blocks[:held], length=trace.context_length
            )
        return view

    @property
    def nbytes(self) -> int:
        """The K/V it holds: every replayed position in every layer."""
        return self.table.length * self.table.pool.bytes_per_token

    def free(self) -> None:
        self.table.free()

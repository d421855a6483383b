"""Several eviction runs of one prompt computed together, as a class comparing policies needs them:

    batch = EvictionBatch(model, prompt_ids, [Variant(None), Variant(Policy("snapkv"), compression_ratio=0.5), …])
    batch.prefill()              # the context once, every run's first pass in one batched forward pass
    while not batch.finished:
        batch.step()             # one batched pass: each unfinished run's next token over its own cache

The context's prefill is the same for every policy and for the full cache (kvpress compresses after the whole
prefill), so it runs once: each run scores its prefill evictions from that pass's attention, and the runs' block
tables share its K/V (`BlockTable.fork`: the full blocks by reference, the partly filled last one copied). Then
each step is one forward pass whose rows are the runs' tokens: the weights are read once for all of them, each run
attends over its own blocks through its own masks. Each run's kept positions, logits and tokens are those of the
same `EvictionRun` alone (to float rounding of the batched products: tests/test_eviction_batch.py).

A run may also join after the prefill (`join`, room for `spare` of them in the pool): its table shares the
context's K/V the prefill wrote, and where it evicts after the prefill, the context's attention is computed again
for it without writing anything (`forward(write=False)`: the same numbers). `passes([run])` then catches it up, and
it steps with the others once appended to `runs`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from engine.errors import GenerationStateError, InvalidSettingError
from engine.eviction.budgets import DecodeBudget, StreamingWindow
from engine.eviction.policies import Policy
from engine.eviction.records import EvictionStep
from engine.eviction.run import EvictionRun
from engine.kv_cache import DEFAULT_BLOCK_SIZE, BlockTable
from engine.model import Model
from engine.trace import NO_RECORD


@dataclass(frozen=True)
class Variant:
    """One run's eviction: `EvictionRun`'s policy, compression_ratio, budget and rerotate (all None / 0 / False: the
    full cache)."""

    policy: Policy | None
    compression_ratio: float = 0.0
    budget: DecodeBudget | StreamingWindow | None = None
    rerotate: bool = False


class EvictionBatch:
    """`EvictionRun`s of one prompt, one per variant, prefilled once and stepped in one forward pass each step."""

    def __init__(
        self,
        model: Model,
        prompt_ids: list[int],
        variants: Sequence[Variant],
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        max_new_tokens: int = 32,
        keep_full_steps: int = 32,
        spare: int = 0,
    ):
        if not variants:
            raise InvalidSettingError("an eviction batch needs at least one variant")
        self.model = model
        self.prompt_ids = list(prompt_ids)
        self.block_size, self.max_new_tokens, self.keep_full_steps = block_size, max_new_tokens, keep_full_steps
        context = len(self.prompt_ids) - 1
        answer = min(context + 1 + max_new_tokens, model.info.context_limit) - context
        # The context's blocks once, and each run's own: a copy of the context's last block and its answer's (the
        # pool's memory is taken as blocks are written: room for runs that never join costs nothing).
        blocks = math.ceil(context / block_size) + (len(variants) + spare) * (math.ceil(answer / block_size) + 1)
        self.pool = model.new_pool(blocks, block_size)
        self.context: BlockTable | None = None  # the context's K/V once prefilled, for the runs that join later
        self.runs = [self._run(v) for v in variants]

    def _run(self, v: Variant) -> EvictionRun:
        return EvictionRun(
            self.model,
            self.prompt_ids,
            v.policy,
            compression_ratio=v.compression_ratio,
            budget=v.budget,
            block_size=self.block_size,
            max_new_tokens=self.max_new_tokens,
            keep_full_steps=self.keep_full_steps,
            pool=self.pool,
            rerotate=v.rerotate,
        )

    @property
    def finished(self) -> bool:
        return all(run.finished for run in self.runs)

    def prefill(self) -> list[EvictionStep]:
        """The context in one pass into the first run's table, every run evicting from its attention; the other
        runs' tables forked from it; then every run's first pass (the last prompt token), batched."""
        first = self.runs[0]
        table = first.table
        observers = [o for o in (run.start_prefill(table) for run in self.runs) if o is not None]

        def observe(layer, result, q) -> None:
            for o in observers:
                o(layer, result, q)

        n = len(self.prompt_ids) - 1
        table.append(n)
        self.model.forward(self.prompt_ids[:-1], list(range(n)), table, NO_RECORD, observe=observe)
        self.context = table.fork()
        for run in self.runs[1:]:
            run.table = table.fork()
        for run in self.runs:
            run.table.slide()
        return self.passes(self.runs)

    def step(self) -> list[EvictionStep | None]:
        """One batched pass of every run that has not finished (None for those that have)."""
        return self.passes(self.runs)

    def add(self, variant: Variant) -> EvictionRun:
        """A run of `variant` added before the prefill: one of `runs`, prefilled with them."""
        if self.context is not None:
            raise GenerationStateError("a run is added before prefill(); after it, it joins (join())")
        run = self._run(variant)
        self.runs.append(run)
        return run

    def join(self, variant: Variant) -> EvictionRun:
        """A run of `variant` that joins after the prefill, in this batch's pool: evicted from the context as the
        prefill's runs were, no pass made yet (`passes` makes them). Not one of `runs` until appended."""
        if self.context is None:
            raise GenerationStateError("a run joins after prefill(); before it, pass its variant to the batch")
        run = self._run(variant)
        table = self.context.fork()
        observe = run.start_prefill(table)
        if observe is not None:  # the context's attention again, read from the K/V its prefill wrote
            n = len(self.prompt_ids) - 1
            self.model.forward(
                self.prompt_ids[:-1], list(range(n)), BlockTable(self.pool), NO_RECORD, write=False, observe=observe
            )
        run.table = table
        run.table.slide()
        return run

    def passes(self, runs: Sequence[EvictionRun]) -> list[EvictionStep | None]:
        """One batched pass of each of `runs` (of this batch or joining it) that has not finished: its next token,
        the last prompt token first (None for those that have finished)."""
        opened = {
            run: run.open_pass(run.generated[-1] if run.steps else self.prompt_ids[-1], run.table.length)
            for run in runs
            if not (run.steps and run.finished)
        }
        records = self.model.forward_batch(list(opened.values())) if opened else []
        done = {run: run.close_pass(p, record) for (run, p), record in zip(opened.items(), records)}
        return [done.get(run) for run in runs]

    def close(self) -> None:
        for run in self.runs:
            run.close()
        if self.context is not None:
            self.context.free()
            self.context = None

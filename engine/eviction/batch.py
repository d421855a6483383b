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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from engine.errors import InvalidSettingError
from engine.eviction.policies import Policy
from engine.eviction.run import DecodeBudget, EvictionRun, EvictionStep, StreamingWindow
from engine.kv_cache import DEFAULT_BLOCK_SIZE
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

    def __init__(self, model: Model, prompt_ids: list[int], variants: Sequence[Variant], *,
                 block_size: int = DEFAULT_BLOCK_SIZE, max_new_tokens: int = 32, keep_full_steps: int = 32):
        if not variants:
            raise InvalidSettingError("an eviction batch needs at least one variant")
        self.model = model
        self.prompt_ids = list(prompt_ids)
        context = len(self.prompt_ids) - 1
        answer = min(context + 1 + max_new_tokens, model.info.context_limit) - context
        # The context's blocks once, and each run's own: a copy of the context's last block and its answer's.
        blocks = math.ceil(context / block_size) + len(variants) * (math.ceil(answer / block_size) + 1)
        self.pool = model.new_pool(blocks, block_size)
        self.runs = [EvictionRun(model, prompt_ids, v.policy, compression_ratio=v.compression_ratio, budget=v.budget,
                                 block_size=block_size, max_new_tokens=max_new_tokens,
                                 keep_full_steps=keep_full_steps, pool=self.pool, rerotate=v.rerotate)
                     for v in variants]

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
        for run in self.runs[1:]:
            run.table = table.fork()
        for run in self.runs:
            run.table.slide()
        return self._passes([(run, self.prompt_ids[-1]) for run in self.runs])

    def step(self) -> list[EvictionStep | None]:
        """One batched pass of every run that has not finished (None for those that have)."""
        return self._passes([(run, run.generated[-1]) for run in self.runs if not run.finished])

    def _passes(self, inputs: list[tuple[EvictionRun, int]]) -> list[EvictionStep | None]:
        opened = {run: run.open_pass(token_id, run.table.length) for run, token_id in inputs}
        records = self.model.forward_batch(list(opened.values()))
        done = {run: run.close_pass(p, record) for (run, p), record in zip(opened.items(), records)}
        return [done.get(run) for run in self.runs]

    def close(self) -> None:
        for run in self.runs:
            run.close()

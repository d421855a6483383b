"""The eviction view's runs: the page's prompt decoded greedily over the full cache and under each policy pages ask
for at the link's time of eviction (after the prefill at a ratio, during decode to a budget, or a streaming window),
all in one `engine.eviction.EvictionBatch` (one prefill, one batched pass per step), stepped along with the pages and
kept in the server's run store (`ui.runs.store`: counted in its bytes, dropped when idle, built once for pages asking at
once). A page compares the full cache with its policy (`EvictionPair`); a policy the lab already runs is read, not
computed again, and one it lacks joins it (`EvictionLab`), so a class comparing policies computes each step of each
policy once, and none that no page looks at.

Plain Python (no Streamlit). What the view draws is recorded here as each pass runs (`PassRecord`: small arrays),
so the engine's runs can drop every older step's attention, logits and masks (`keep_full_steps=1`). Before anything
is built the lab's memory is estimated against the host's step budget (KVSCOPE_STEP_MEMORY_MB): its steps are
capped to what fits, or the lab is refused (`ui.runs.eviction_settings.plan`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

import engine
from engine.detokenizer import IncrementalDetokenizer
from engine.errors import InvalidSettingError
from engine.eviction import DecodeBudget, EvictionRun
from engine.eviction.batch import EvictionBatch
from engine.eviction.settings import check_budget
from ui.host import press_log
from ui.runs import turns
from ui.runs.eviction_settings import EvictionPlan, EvictionSettings, lab_bytes, plan
from ui.runs.store import RunStore


@dataclass
class PassRecord:
    """One pass of one run, as the view draws it."""

    position: int
    token_id: int
    piece: str  # the text the token adds (a split character's bytes held back until it is whole)
    kept: np.ndarray  # (layers, kv_heads, position + 1) int8: 1 read, 0 evicted by the policy, 2 outside the window
    evicted_share: np.ndarray  # (layers, q_heads) the share full attention puts on what this pass did not read
    sink_share: np.ndarray  # (layers, q_heads) the attention this pass put on position 0
    kept_bytes: int  # after the pass (and its eviction): the K/V of the rows every (layer, KV head) holds
    allocated_bytes: int  # the paged blocks under them: evicted rows are masked, not freed
    full_bytes: int  # the cache without eviction at the same positions
    # KL(full cache ‖ this run) of the two passes' next-token distributions, in nats: what evicting cost this
    # prediction. None for the full cache's own run, and after the run's text parted from the full cache's (the two
    # then predict after different texts, so the comparison no longer isolates eviction).
    kl: float | None = None


OUTSIDE_WINDOW = 2
# The full cache's passes whose logits a joining policy's catch-up computes again at once (`EvictionLab`): on one
# thread lm_head with 8 rows took 23 ms here, one row 8.8 ms (SmolLM2, float32, AVX2).
LOGITS_AT_ONCE = 8


def next_token_kl(full: torch.Tensor, evicting: torch.Tensor) -> float:
    """KL(P ‖ Q) in nats, P and Q the softmax of two passes' logits (vocab,): the full cache's and a policy's."""
    p, q = full.double().log_softmax(-1), evicting.double().log_softmax(-1)
    return float((p.exp() * (p - q)).sum())


class RecordedVariant:
    """One variant of a lab (the full cache or a policy), each of its passes recorded (`passes[i]` made answer token
    i + 1)."""

    def __init__(self, model: engine.Model, run: EvictionRun):
        self.model = model
        self.run = run
        self.policy = run.policy
        self.detokenizer = IncrementalDetokenizer(model.tokenizer, run.prompt_ids)
        self.passes: list[PassRecord] = []
        self.agrees = True  # every pass so far made the full cache's token

    def record(self, step, full: tuple[torch.Tensor, int] | None = None) -> None:
        """Record `step`, this run's newest pass; `full`, the full cache's logits and token for the same answer
        token (None for the full cache's run itself), gives its KL while both texts agree so far."""
        info, run = self.model.info, self.run
        length = step.position + 1
        kept = np.ones((info.layers, info.kv_heads, length), dtype=np.int8)
        for layer, mask in enumerate(step.kept):
            if mask is not None:
                kept[layer] = mask.numpy().astype(np.int8)
            else:  # a sliding-window layer (or no eviction): its window is what it reads
                kept[layer, :, : length - info.cached_positions(layer, length)] = OUTSIDE_WINDOW
        kl = None
        if full is not None and self.agrees:
            full_logits, full_token = full
            kl = next_token_kl(full_logits, step.logits)
            self.agrees = step.token_id == full_token
        # copies: a view of the pass's attention would hold all of it, every position's, while the lab lives
        evicted_share = step.evicted_share.float().numpy().copy()
        sink_share = step.attention[:, :, 0].float().numpy().copy()
        final = run.finished
        self.passes.append(
            PassRecord(
                step.position,
                step.token_id,
                self.detokenizer.add(step.token_id, final=final),
                kept,
                evicted_share,
                sink_share,
                run.kept_bytes(),
                run.allocated_bytes(),
                run.full_bytes(),
                kl,
            )
        )

    @property
    def nbytes(self) -> int:
        """The passes recorded here and what the engine's run keeps of them."""
        recorded = sum(p.kept.nbytes + p.evicted_share.nbytes + p.sink_share.nbytes for p in self.passes)
        return recorded + self.run.records_nbytes()


class EvictionLab:
    """The full cache's run and the run of each policy a page asked for, with one set of lab settings (when to evict
    and how much), on one prompt, stepped together: one batched pass a step for all of them
    (`engine.eviction.batch`). A policy asked for first is in the lab from its prefill; one asked for later joins it,
    catching up alone, one row a pass, then steps with the others. Its KL needs the full cache's logits at every
    pass, which the lab does not keep (a vocabulary's worth each): where a policy may join, it keeps the full cache's
    final hidden state of every pass (a hidden's worth) and a joining pass computes their logits again with lm_head.
    So a lab computes what its pages look at, not every policy."""

    def __init__(
        self, model: engine.Model, prompt_ids: list[int], lab_settings: EvictionSettings, steps: int, budget_bytes: int
    ):
        self.model = model  # held: the store's key names it by id, which stays its own while the lab lives
        self.lab_settings, self.prompt, self.steps = lab_settings, len(prompt_ids), steps
        self.budget_bytes = budget_bytes
        self.variants = lab_settings.variants(len(prompt_ids) - 1)  # every run it may hold (the full cache: None)
        self.batch = EvictionBatch(
            model, prompt_ids, [self.variants[None]], max_new_tokens=steps, keep_full_steps=1, spare=len(self.variants)
        )
        self.runs = {None: RecordedVariant(model, self.batch.runs[0])}
        self.full_hidden: list[torch.Tensor] = []  # the full cache's pass i's final hidden state, for a joining KL
        self._logits: tuple[int, torch.Tensor] = (0, torch.empty(0))  # (first pass, logits): `_full_logits`'s
        self.joining: dict[str, RecordedVariant] = {}  # name → the policy's run, catching up
        self.lock = threading.Lock()  # one page steps the lab at a time; others read the passes it has

    def advance_to(self, count: int, name: str | None = None, progress: Callable[[int], None] | None = None) -> None:
        """The full cache's run and `name`'s (joined first where the lab lacks it) to `count` answer tokens, with every
        other run of the lab, or as far as they go; the page's turn shared between two passes (`turns.share`), with
        the lab's lock let go. `progress(passes)` is told each time the pair has more: the passes `name`'s run has
        while it joins, else the full cache's."""
        told = 0
        while True:
            with press_log.held(self.lock):
                work = self._next_work(count, name)
                if work is None:  # no turn shared after the last pass: the page draws next
                    return
                with press_log.timed("engine"):
                    work()
                done = len(self.joining.get(name, self.runs[None]).passes)
            if progress is not None and done > told:
                told = done
                progress(done)
            turns.share()

    def _next_work(self, count: int, name: str | None):
        """One pass's worth of what `advance_to` still has to do, or None."""
        full = self.runs[None]
        if name is not None and name not in self.runs:
            if not full.passes:  # not prefilled yet: the policy is in from the start
                return lambda: self._add(name)
            if name not in self.joining:
                return lambda: self._start_joining(name)
            joiner = self.joining[name]
            if len(joiner.passes) < len(full.passes) and not (joiner.passes and joiner.run.finished):
                return lambda: self._record(self.batch.passes([joiner.run]), [joiner])
            return lambda: self._admit(name)
        if self._short_of(count):
            members = list(self.runs.values())
            return lambda: self._record(self.batch.prefill() if not full.passes else self.batch.step(), members)
        return None

    def _add(self, name: str) -> None:
        self.runs[name] = RecordedVariant(self.model, self.batch.add(self.variants[name]))

    def _start_joining(self, name: str) -> None:
        held = len(self.runs) + len(self.joining) + 1  # with this one
        if lab_bytes(self.model.info, self.prompt, self.steps, self.lab_settings, held) > self.budget_bytes:
            raise EvictionLabFull([n for n in self.runs if n is not None])
        self.joining[name] = RecordedVariant(self.model, self.batch.join(self.variants[name]))

    def _admit(self, name: str) -> None:
        joiner = self.joining.pop(name)
        self._logits = (0, torch.empty(0))
        self.batch.runs.append(joiner.run)
        self.runs[name] = joiner

    def _record(self, steps, recorded: list[RecordedVariant]) -> None:
        """Record a batched pass's steps, the full cache's first where it is one of them, each policy's with its KL
        from the full cache's pass for the same answer token: that pass's own logits, or for a policy catching up,
        lm_head's of its kept final hidden state."""
        full_run, full_step = self.runs[None], None
        for run, step in zip(recorded, steps):
            if step is None:
                continue
            if run is full_run:
                full_step = step
                if self.lab_settings.joinable:
                    self.full_hidden.append(step.final_hidden)
                run.record(step)
                continue
            i = len(run.passes)
            if full_step is not None:
                run.record(step, (full_step.logits, full_step.token_id))
            elif i < len(full_run.passes) and run.agrees:
                run.record(step, (self._full_logits(i), full_run.passes[i].token_id))
            else:  # parted from the full cache's text, or past its end (its EOS): nothing to compare with
                run.record(step)

    def _full_logits(self, i: int) -> torch.Tensor:
        """The full cache's logits at pass i, computed again from its final hidden state, `LOGITS_AT_ONCE` passes at
        a time: a product of lm_head with a few rows reads it once, and costs about what one row's does."""
        start, chunk = self._logits
        if not start <= i < start + len(chunk):
            rows = torch.stack(self.full_hidden[i : i + LOGITS_AT_ONCE])
            with torch.inference_mode():
                self._logits = (i, self.model.logits(rows))
            start, chunk = self._logits
        return chunk[i - start]

    def _short_of(self, count: int) -> bool:
        """Whether some run that can go on has fewer than `count` passes."""
        return any(len(r.passes) < count and not (r.passes and r.run.finished) for r in self.runs.values())

    @property
    def nbytes(self) -> int:
        """The pool's blocks in use, every run's records (those joining too) and the full cache's final hidden
        states. Read from copies: a page may add a run meanwhile."""
        pool = self.batch.pool
        runs = list(self.runs.values()) + list(self.joining.values())
        hidden = sum(t.nbytes for t in list(self.full_hidden)) + self._logits[1].nbytes
        return pool.block_manager.used * pool.block_size * pool.bytes_per_token + sum(r.nbytes for r in runs) + hidden


@dataclass
class EvictionPair:
    """The full cache's run and the policy's, on one prompt: what the view compares (two runs of one lab)."""

    name: str  # the lab's run of the policy (or the streaming window's)
    plan: EvictionPlan
    lab: EvictionLab

    @property
    def full(self) -> RecordedVariant:
        return self.lab.runs[None]

    @property
    def evicting(self) -> RecordedVariant:
        return self.lab.runs[self.name]

    def advance_to(self, count: int, progress: Callable[[int], None] | None = None) -> int:
        """Both runs to `count` answer tokens (or as far as they go); the passes both have. `progress`: the lab's."""
        self.lab.advance_to(min(count, self.plan.steps), self.name, progress)
        return min(len(self.full.passes), len(self.evicting.passes))  # a lab decodes at most plan.steps


def pair_for(
    store: RunStore,
    model: engine.Model,
    prompt_ids: list[int],
    settings: EvictionSettings,
    wanted: int,
    step_memory_mb: int,
) -> EvictionPair:
    """The pair for these settings, from the lab for their lab settings in `store` (built once); raises
    `InvalidSettingError` (the engine's, or a plan with no step that fits the host's step memory) before anything
    is held."""
    budget = settings.engine_budget()
    if isinstance(budget, DecodeBudget):  # a policy the lab leaves out at this budget: the engine's reason
        check_budget(settings.engine_policy(len(prompt_ids) - 1), budget)
    found = plan(model.info, len(prompt_ids), wanted, settings, step_memory_mb * 10**6)
    if found.steps == 0:
        raise EvictionTooLarge(found)
    lab_settings = settings.lab_settings
    key = ("eviction", id(model), tuple(prompt_ids), found.steps, lab_settings)
    lab = store.get(key, lambda: EvictionLab(model, prompt_ids, lab_settings, found.steps, step_memory_mb * 10**6))
    return EvictionPair(settings.run_name, found, lab)


class EvictionTooLarge(InvalidSettingError):
    """Not one step of the pair fits the host's step memory."""

    def __init__(self, found: EvictionPlan):
        self.plan = found
        super().__init__(
            f"eviction on this prompt needs about {found.estimated_bytes:,} bytes for one step, more than "
            f"this server's step memory allows"
        )


class EvictionLabFull(InvalidSettingError):
    """The lab's runs fill the host's step memory: no other policy can join it."""

    def __init__(self, names: list[str]):
        self.names = names
        super().__init__(f"this prompt's eviction runs fill this server's step memory: it compares {', '.join(names)}")


def first_difference(full: list[int], evicting: list[int]) -> int | None:
    """The index of the first answer token where the two runs differ (None: the same so far)."""
    for i, (a, b) in enumerate(zip(full, evicting)):
        if a != b:
            return i
    return None if len(full) == len(evicting) else min(len(full), len(evicting))

"""The eviction view's runs: the page's prompt decoded greedily over the full cache and under each policy at the
link's timing (after the prefill at a ratio, during decode to a budget, or a streaming window), all in one
`engine.eviction.EvictionBatch` (one prefill, one batched pass per step), stepped along with the pages and kept in
the server's run store (`ui.run_store`: counted in its bytes, dropped when idle, built once for pages asking at
once). A page compares the full cache with its policy (`EvictionPair`); another policy at the same timing is a run
the lab has already computed, so a class comparing policies computes each step once.

Plain Python (no Streamlit). What the view draws is recorded here as each pass runs (`PassRecord`: small arrays),
so the engine's runs can drop every older step's attention, logits and masks (`keep_full_steps=1`). Before anything
is built the lab's memory is estimated against the host's step budget (KVSCOPE_STEP_MEMORY_MB): its steps are
capped to what fits, or the lab is refused (`EvictionPlan`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace

import numpy as np
import torch

import engine
from engine.detokenizer import IncrementalDetokenizer
from engine.errors import InvalidSettingError
from engine.eviction import POLICIES, DecodeBudget, EvictionRun, Policy, StreamingWindow
from engine.eviction.policies import SNAPKV_SCORES
from engine.eviction.run import check_budget
from engine.eviction.batch import EvictionBatch, Variant
from engine.kv_cache import DEFAULT_BLOCK_SIZE
from ui.follow import turns
from ui.run_store import RunStore
from ui.state import AppState

N_SINK = 4  # kvpress's and the StreamingLLM paper's sinks
SNAPKV_WINDOW = 64  # kvpress's window_size; shorter where the prompt (or the decode interval) is shorter
LAG_SIZE = 128  # kvpress's LagKV lag_size; shorter where the context holds fewer than four partitions of it
STREAM = "stream"  # the streaming window's run in a lab (it keeps by position: no policy)


@dataclass(frozen=True)
class EvictionSettings:
    """What the link says to evict: `policy` scores positions; `at` says when ("prefill": once, at `ratio`;
    "decode": every `interval` passes, to `budget` positions; "stream": the first N_SINK and the latest `window`)."""

    policy: str
    at: str
    ratio: float
    budget: int
    interval: int
    window: int

    @classmethod
    def of(cls, state: AppState) -> EvictionSettings:
        return cls(state.evict, state.evict_at, float(state.ratio), int(state.budget), int(state.interval),
                   int(state.stream_window))

    def engine_policy(self, context: int) -> Policy | None:
        """The engine's policy for a prompt whose context (all but its last token) is `context` positions. SnapKV's
        window (PyramidKV's and AdaKV's, which score as it does) is kvpress's 64 where more queries than that ran,
        else a quarter of them (prefill) or the interval less one (decode): its score reads only the queries of its
        window. LagKV's lag is kvpress's 128 where the context after the sinks holds four partitions of it, else a
        quarter of that context: with fewer than two partitions it only keeps the latest positions."""
        if self.at == "stream":
            return None
        if self.policy in SNAPKV_SCORES:
            queries = context // 4 if self.at == "prefill" else self.interval - 1
            return Policy(self.policy, window_size=max(1, min(SNAPKV_WINDOW, queries)))
        if self.policy == "lagkv":
            return Policy("lagkv", n_sink=N_SINK, lag_size=max(1, min(LAG_SIZE, (context - N_SINK) // 4)))
        return Policy(self.policy, n_sink=N_SINK)

    def engine_budget(self) -> DecodeBudget | StreamingWindow | None:
        if self.at == "decode":
            return DecodeBudget(self.budget, self.interval)
        if self.at == "stream":
            return StreamingWindow(N_SINK, self.window)
        return None

    @property
    def timing(self) -> EvictionSettings:
        """These settings less the policy: what a lab's runs share (the policy picks one of them)."""
        return replace(self, policy="")

    @property
    def run_name(self) -> str:
        """The lab's run these settings read: the policy's, or the streaming window's."""
        return STREAM if self.at == "stream" else self.policy

    def variants(self, context: int) -> dict[str | None, Variant]:
        """The lab's runs at this timing, by name: the full cache (None) first, then every policy (or the
        streaming window alone)."""
        names = [STREAM] if self.at == "stream" else list(POLICIES)
        ratio, budget = (self.ratio if self.at == "prefill" else 0.0), self.engine_budget()
        runs: dict[str | None, Variant] = {None: Variant(None)}
        for name in names:
            policy = replace(self, policy=name).engine_policy(context)
            if isinstance(budget, DecodeBudget) and not fits_budget(policy, budget):
                continue  # the view says why, where this policy is the page's (`ui.eviction_shown.check`)
            runs[name] = Variant(policy, ratio, budget)
        return runs


def fits_budget(policy: Policy, budget: DecodeBudget) -> bool:
    """Whether the policy can keep this decode budget (the engine's own check)."""
    try:
        check_budget(policy, budget)
    except InvalidSettingError:
        return False
    return True


@dataclass(frozen=True)
class EvictionPlan:
    """How many answer tokens the pair may decode within the host's step memory (0: it cannot run at all), and
    the bytes it is estimated to hold at most."""

    steps: int
    estimated_bytes: int
    wanted: int


def evictions(settings: EvictionSettings, steps: int) -> int:
    """How many times the policy's run evicts in `steps` passes: once after the prefill, at every pass (the
    streaming window), or every `interval` passes (a decode budget)."""
    return {"prefill": 1, "stream": steps, "decode": -(-steps // settings.interval)}[settings.at]


def lab_bytes(info: engine.ModelInfo, prompt: int, steps: int, settings: EvictionSettings) -> int:
    """What a lab decoding `steps` tokens after a `prompt`-token prompt holds at most, in bytes: one paged pool (the
    prompt's K/V once, each run's answer and a copied block of its own); per pass and run, the record's mask of what
    each (layer, KV head) read (int8), the engine's mask of its latest pass (bool) and the shares recorded (three
    float32 per layer and Q head); per eviction of a policy's run, its rows (positions and rows int64, scores
    float32); each run's latest attention and logits; the prefill's one layer of n × n probabilities and scores."""
    runs = len(settings.variants(prompt - 1))
    length = prompt + steps
    pool = (prompt + runs * (steps + 2 * DEFAULT_BLOCK_SIZE)) * info.kv_bytes_per_token
    masks = runs * (steps + 1) * info.layers * info.kv_heads * length
    shares = runs * steps * 3 * info.layers * info.q_heads * 4
    evicted = (runs - 1) * evictions(settings, steps) * info.layers * info.kv_heads * length * 20
    latest = runs * (info.layers * info.q_heads * length * 4 + info.vocab * 4)
    prefill = info.q_heads * prompt * prompt * 4 * 2
    return pool + masks + shares + evicted + latest + prefill


def plan(info: engine.ModelInfo, prompt: int, wanted: int, settings: EvictionSettings, budget_bytes: int
         ) -> EvictionPlan:
    """The most steps (up to `wanted`) whose pair fits `budget_bytes` (0: not even one)."""
    fits = lambda s: lab_bytes(info, prompt, s, settings) <= budget_bytes  # noqa: E731 — grows with s
    low, high = 0, wanted
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return EvictionPlan(low, lab_bytes(info, prompt, max(low, 1), settings), wanted)


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


def next_token_kl(full: torch.Tensor, evicting: torch.Tensor) -> float:
    """KL(P ‖ Q) in nats, P and Q the softmax of two passes' logits (vocab,): the full cache's and a policy's."""
    p, q = full.double().log_softmax(-1), evicting.double().log_softmax(-1)
    return float((p.exp() * (p - q)).sum())


class RecordedRun:
    """One run of a lab, each of its passes recorded (`passes[i]` made answer token i + 1)."""

    def __init__(self, model: engine.Model, run: EvictionRun):
        self.model = model
        self.run = run
        self.policy = run.policy
        self.detokenizer = IncrementalDetokenizer(model.tokenizer, run.prompt_ids)
        self.passes: list[PassRecord] = []
        self.agrees = True  # every pass so far made the full cache's token

    def record(self, step, full_step=None) -> None:
        """Record `step`, this run's newest pass; `full_step`, the full cache's pass for the same answer token (None
        for the full cache's run itself), gives its KL while both texts agree so far."""
        info, run = self.model.info, self.run
        length = step.position + 1
        kept = np.ones((info.layers, info.kv_heads, length), dtype=np.int8)
        for layer, mask in enumerate(step.kept):
            if mask is not None:
                kept[layer] = mask.numpy().astype(np.int8)
            else:  # a sliding-window layer (or no eviction): its window is what it reads
                kept[layer, :, :length - info.cached_positions(layer, length)] = OUTSIDE_WINDOW
        kl = None
        if full_step is not None and self.agrees:
            kl = next_token_kl(full_step.logits, step.logits)
            self.agrees = step.token_id == full_step.token_id
        # copies: a view of the pass's attention would hold all of it, every position's, while the lab lives
        evicted_share = step.evicted_share.float().numpy().copy()
        sink_share = step.attention[:, :, 0].float().numpy().copy()
        final = run.finished
        self.passes.append(PassRecord(step.position, step.token_id, self.detokenizer.add(step.token_id, final=final),
                                      kept, evicted_share, sink_share, run.kept_bytes(), run.allocated_bytes(),
                                      run.full_bytes(), kl))

    @property
    def nbytes(self) -> int:
        """The passes recorded here and what the engine's run keeps of them."""
        recorded = sum(p.kept.nbytes + p.evicted_share.nbytes + p.sink_share.nbytes for p in self.passes)
        return recorded + self.run.records_nbytes()


class EvictionLab:
    """The full cache's run and every policy's at one timing, on one prompt, stepped together as pages ask."""

    def __init__(self, model: engine.Model, prompt_ids: list[int], timing: EvictionSettings, steps: int):
        variants = timing.variants(len(prompt_ids) - 1)
        self.model = model  # held: the store's key names it by id, which stays its own while the lab lives
        self.batch = EvictionBatch(model, prompt_ids, list(variants.values()), max_new_tokens=steps,
                                   keep_full_steps=1)
        self.runs = {name: RecordedRun(model, run) for name, run in zip(variants, self.batch.runs)}
        self.lock = threading.Lock()  # one page steps the lab at a time; others read the passes it has

    def advance_to(self, count: int) -> None:
        """Every run to `count` answer tokens, or as far as it goes; the page's turn shared between two passes
        (`turns.share`), with the lab's lock let go."""
        while True:
            with self.lock:
                if self._short_of(count):
                    steps = self.batch.step() if self.runs[None].passes else self.batch.prefill()
                    full = steps[0]  # the full cache's run is the lab's first
                    for recorded, step in zip(self.runs.values(), steps):
                        if step is not None:
                            recorded.record(step, None if step is full else full)
                if not self._short_of(count):  # no turn shared after the last pass: the page draws next
                    return
            turns.share()

    def _short_of(self, count: int) -> bool:
        """Whether some run that can go on has fewer than `count` passes."""
        return any(len(r.passes) < count and not (r.passes and r.run.finished) for r in self.runs.values())

    @property
    def nbytes(self) -> int:
        """The pool's blocks in use and every run's records."""
        pool = self.batch.pool
        return pool.used_blocks * pool.block_size * pool.bytes_per_token + sum(r.nbytes for r in self.runs.values())


@dataclass
class EvictionPair:
    """The full cache's run and the policy's, on one prompt: what the view compares (two runs of one lab)."""

    full: RecordedRun
    evicting: RecordedRun
    plan: EvictionPlan
    lab: EvictionLab

    def advance_to(self, count: int) -> int:
        """Both runs to `count` answer tokens (or as far as they go); the passes both have."""
        self.lab.advance_to(min(count, self.plan.steps))
        return min(len(self.full.passes), len(self.evicting.passes))  # a lab decodes at most plan.steps


def pair_for(store: RunStore, model: engine.Model, prompt_ids: list[int], settings: EvictionSettings, wanted: int,
             step_memory_mb: int) -> EvictionPair:
    """The pair for these settings, from the lab of their timing in `store` (built once); raises
    `InvalidSettingError` (the engine's, or a plan with no step that fits the host's step memory) before anything
    is held."""
    budget = settings.engine_budget()
    if isinstance(budget, DecodeBudget):  # a policy the lab leaves out at this budget: the engine's reason
        check_budget(settings.engine_policy(len(prompt_ids) - 1), budget)
    found = plan(model.info, len(prompt_ids), wanted, settings, step_memory_mb * 10**6)
    if found.steps == 0:
        raise EvictionTooLarge(found)
    timing = settings.timing
    key = ("eviction", id(model), tuple(prompt_ids), found.steps, timing)
    lab = store.get(key, lambda: EvictionLab(model, prompt_ids, timing, found.steps))
    return EvictionPair(lab.runs[None], lab.runs[settings.run_name], found, lab)


class EvictionTooLarge(InvalidSettingError):
    """Not one step of the pair fits the host's step memory."""

    def __init__(self, found: EvictionPlan):
        self.plan = found
        super().__init__(f"eviction on this prompt needs about {found.estimated_bytes:,} bytes for one step, more than "
                         f"this server's step memory allows")


def first_difference(full: list[int], evicting: list[int]) -> int | None:
    """The index of the first answer token where the two runs differ (None: the same so far)."""
    for i, (a, b) in enumerate(zip(full, evicting)):
        if a != b:
            return i
    return None if len(full) == len(evicting) else min(len(full), len(evicting))

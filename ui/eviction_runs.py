"""The eviction view's runs: the page's prompt decoded greedily twice by `engine.eviction.EvictionRun`, once over the
full cache and once under the link's eviction settings, stepped along with the page and shared by every page that
asks for the same pair (a class on one step computes it once). The full cache's run does not depend on the eviction
settings, so a change of policy (what a class compares) computes only the policy's run.

Plain Python (no Streamlit). What the view draws is recorded here as each pass runs (`PassRecord`: small arrays),
so the engine's runs can drop every older step's attention and logits (`keep_full_steps=1`). Before anything is
built the pair's memory is estimated against the host's step budget (KVSCOPE_STEP_MEMORY_MB): its steps are capped
to what fits, or the pair is refused (`EvictionPlan`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

import engine
from engine.detokenizer import IncrementalDetokenizer
from engine.errors import InvalidSettingError
from engine.eviction import DecodeBudget, EvictionRun, Policy, StreamingWindow
from ui.runs import Memo
from ui.state import AppState

N_SINK = 4  # kvpress's and the StreamingLLM paper's sinks
SNAPKV_WINDOW = 64  # kvpress's window_size; shorter where the prompt (or the decode interval) is shorter
PAIRS = Memo(2)  # a pair holds two runs' pools: only the latest two settings stay (a class shares one)
FULL_RUNS = Memo(2)  # the full cache's runs of those pairs, by prompt: pairs with other settings share one


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
        """The engine's policy for a prompt whose context (all but its last token) is `context` positions; SnapKV's
        window is kvpress's 64 where more queries than that ran, else a quarter of them (prefill) or the interval
        less one (decode): its score reads only the queries of its window."""
        if self.at == "stream":
            return None
        if self.policy != "snapkv":
            return Policy(self.policy, n_sink=N_SINK)
        queries = context // 4 if self.at == "prefill" else self.interval - 1
        return Policy("snapkv", window_size=max(1, min(SNAPKV_WINDOW, queries)))

    def engine_budget(self) -> DecodeBudget | StreamingWindow | None:
        if self.at == "decode":
            return DecodeBudget(self.budget, self.interval)
        if self.at == "stream":
            return StreamingWindow(N_SINK, self.window)
        return None


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


def pair_bytes(info: engine.ModelInfo, prompt: int, steps: int, settings: EvictionSettings) -> int:
    """What a pair decoding `steps` tokens after a `prompt`-token prompt holds at most, in bytes: two paged pools;
    per pass and run, the mask of what each (layer, KV head) read (the engine's bool and the record's int8) and
    the shares recorded (three float32 per layer and Q head); per eviction, its rows (positions and rows int64,
    scores float32); each run's latest attention and logits; the prefill's one layer of n × n probabilities and
    scores."""
    length = prompt + steps
    pool = 2 * length * info.kv_bytes_per_token
    masks = 2 * steps * info.layers * info.kv_heads * length * 2
    shares = 2 * steps * 3 * info.layers * info.q_heads * 4
    evicted = evictions(settings, steps) * info.layers * info.kv_heads * length * 20
    latest = 2 * (info.layers * info.q_heads * length * 4 + info.vocab * 4)
    prefill = info.q_heads * prompt * prompt * 4 * 2
    return pool + masks + shares + evicted + latest + prefill


def plan(info: engine.ModelInfo, prompt: int, wanted: int, settings: EvictionSettings, budget_bytes: int
         ) -> EvictionPlan:
    """The most steps (up to `wanted`) whose pair fits `budget_bytes` (0: not even one)."""
    fits = lambda s: pair_bytes(info, prompt, s, settings) <= budget_bytes  # noqa: E731 — grows with s
    low, high = 0, wanted
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return EvictionPlan(low, pair_bytes(info, prompt, max(low, 1), settings), wanted)


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


OUTSIDE_WINDOW = 2


class RecordedRun:
    """An EvictionRun stepped on demand, each pass recorded (`passes[i]` made answer token i + 1)."""

    def __init__(self, model: engine.Model, prompt_ids: list[int], settings: EvictionSettings | None, steps: int):
        context = len(prompt_ids) - 1
        policy = settings.engine_policy(context) if settings else None
        self.model = model
        self.policy = policy
        self.run = EvictionRun(model, prompt_ids, policy,
                               compression_ratio=settings.ratio if settings and settings.at == "prefill" else 0.0,
                               budget=settings.engine_budget() if settings else None,
                               max_new_tokens=steps, keep_full_steps=1)
        self.detokenizer = IncrementalDetokenizer(model.tokenizer, prompt_ids)
        self.passes: list[PassRecord] = []
        self.lock = threading.Lock()  # one page steps the run at a time; others read the passes it has

    def advance_to(self, count: int) -> None:
        with self.lock:
            while len(self.passes) < count and not (self.passes and self.run.finished):
                step = self.run.step() if self.passes else self.run.prefill()
                self.passes.append(self._record(step))

    def _record(self, step) -> PassRecord:
        info, run = self.model.info, self.run
        length = step.position + 1
        kept = np.ones((info.layers, info.kv_heads, length), dtype=np.int8)
        for layer, mask in enumerate(step.kept):
            if mask is not None:
                kept[layer] = mask.numpy().astype(np.int8)
            else:  # a sliding-window layer (or no eviction): its window is what it reads
                kept[layer, :, :length - info.cached_positions(layer, length)] = OUTSIDE_WINDOW
        attention = step.attention.float()
        final = run.finished
        return PassRecord(step.position, step.token_id, self.detokenizer.add(step.token_id, final=final), kept,
                          step.evicted_share.float().numpy(), attention[:, :, 0].numpy(), run.kept_bytes(),
                          run.allocated_bytes(), run.full_bytes())


@dataclass
class EvictionPair:
    """The full cache's run and the policy's, on one prompt: what the view compares."""

    full: RecordedRun  # shared with the pairs of other settings on the same prompt and steps
    evicting: RecordedRun
    plan: EvictionPlan

    def advance_to(self, count: int) -> int:
        """Both runs to `count` answer tokens (or as far as they go); the passes both have."""
        count = min(count, self.plan.steps)
        self.full.advance_to(count)
        self.evicting.advance_to(count)
        return min(len(self.full.passes), len(self.evicting.passes))


def pair_for(model: engine.Model, prompt_ids: list[int], settings: EvictionSettings, wanted: int,
             step_memory_mb: int) -> EvictionPair:
    """The shared pair for these settings (built once); raises `InvalidSettingError` (the engine's, or a plan with
    no step that fits the host's step memory) before anything is held."""
    found = plan(model.info, len(prompt_ids), wanted, settings, step_memory_mb * 10**6)
    if found.steps == 0:
        raise EvictionTooLarge(found)
    run = (id(model), model.info.name, tuple(prompt_ids), found.steps)

    def build() -> EvictionPair:
        full = FULL_RUNS.made(run, lambda: RecordedRun(model, prompt_ids, None, found.steps))
        return EvictionPair(full, RecordedRun(model, prompt_ids, settings, found.steps), found)

    return PAIRS.made((*run, settings), build)


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

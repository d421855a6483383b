"""What the link says to evict, and what a lab of it may hold: the settings as the engine's policy and budget for a
prompt (kvpress's parameters, shortened where the prompt is short), which policies can keep a decode budget, and how
many steps a lab may decode within the host's step memory (`plan`). Plain Python (no Streamlit).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import engine
from engine.errors import InvalidSettingError
from engine.eviction import EVICTION_POLICIES, DecodeBudget, Policy, StreamingWindow
from engine.eviction.batch import Variant
from engine.eviction.policies import SNAPKV_SCORES
from engine.eviction.settings import check_budget
from engine.kv_cache import DEFAULT_BLOCK_SIZE
from ui.state.link import AppState

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
        return cls(
            state.evict,
            state.evict_at,
            float(state.ratio),
            int(state.budget),
            int(state.interval),
            int(state.stream_window),
        )

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
    def lab_settings(self) -> EvictionSettings:
        """These settings less the policy: what a lab's runs share (the policy picks one of them)."""
        return replace(self, policy="")

    @property
    def run_name(self) -> str:
        """The lab's run these settings read: the policy's, or the streaming window's."""
        return STREAM if self.at == "stream" else self.policy

    def variants(self, context: int) -> dict[str | None, Variant]:
        """The lab's runs with these settings, by name: the full cache (None) first, then every policy (or the
        streaming window alone)."""
        names = [STREAM] if self.at == "stream" else list(EVICTION_POLICIES)
        ratio, budget = (self.ratio if self.at == "prefill" else 0.0), self.engine_budget()
        runs: dict[str | None, Variant] = {None: Variant(None)}
        for name in names:
            policy = replace(self, policy=name).engine_policy(context)
            if isinstance(budget, DecodeBudget) and not fits_budget(policy, budget):
                continue  # the view says why, where this policy is the page's (`ui.views.eviction_shown.check`)
            runs[name] = Variant(policy, ratio, budget)
        return runs

    @property
    def joinable(self) -> bool:
        """Whether a lab of these settings may take policies after its prefill: not the streaming window's, which
        is its lab's one run."""
        return self.at != "stream"


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


# What a lab is planned for: the full cache and the first page's policy (or the streaming window). Further policies
# join it while they fit (`EvictionLab`).
PLANNED_RUNS = 2


def lab_bytes(
    info: engine.ModelInfo, prompt: int, steps: int, settings: EvictionSettings, runs: int | None = None
) -> int:
    """What a lab of `runs` runs decoding `steps` tokens after a `prompt`-token prompt holds at most, in bytes: one
    paged pool (the prompt's K/V once, each run's answer and a copied block of its own); per pass and run, the
    record's mask of what each (layer, KV head) read (int8), the engine's mask of its latest pass (bool) and the
    shares recorded (three float32 per layer and Q head); per eviction of a policy's run, its rows (positions and
    rows int64, scores float32); each run's latest attention and logits; the full cache's final hidden state of every
    pass where a policy may join (for its KL); the prefill's one layer of n × n probabilities and scores. By
    default, the runs it is planned for."""
    runs = PLANNED_RUNS if runs is None else runs
    length = prompt + steps
    pool = (prompt + runs * (steps + 2 * DEFAULT_BLOCK_SIZE)) * info.kv_bytes_per_token
    masks = runs * (steps + 1) * info.layers * info.kv_heads * length
    shares = runs * steps * 3 * info.layers * info.q_heads * 4
    evicted = (runs - 1) * evictions(settings, steps) * info.layers * info.kv_heads * length * 20
    latest = runs * (info.layers * info.q_heads * length * 4 + info.vocab * 4)
    full_hidden = steps * info.hidden * info.element_bytes if settings.joinable else 0
    prefill = info.q_heads * prompt * prompt * 4 * 2
    return pool + masks + shares + evicted + latest + full_hidden + prefill


def plan(
    info: engine.ModelInfo, prompt: int, wanted: int, settings: EvictionSettings, budget_bytes: int
) -> EvictionPlan:
    """The most steps (up to `wanted`) whose pair fits `budget_bytes` (0: not even one): a lab is planned for the
    pair (`PLANNED_RUNS`)."""
    fits = lambda s: lab_bytes(info, prompt, s, settings) <= budget_bytes  # noqa: E731 — grows with s
    low, high = 0, wanted
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return EvictionPlan(low, lab_bytes(info, prompt, max(low, 1), settings), wanted)

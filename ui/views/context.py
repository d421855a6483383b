"""What every view gets: the run's window (`RunView`, every quantity a view or the lesson may read of the run), the
state from the link, the shown step and its trace, and the page's answers to a view's presses. Views read nothing
else: never the model, config, session or run behind the window (tests/test_view_protocol.py)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Protocol

import engine
from engine.tokens import TokenCell
from engine.trace import StepTrace
from ui.state.link import AppState
from ui.state.session import settings, view_controls
from ui.text import strings
from viz.tokens import position_label

if TYPE_CHECKING:
    from engine.busy_pool import BusyPoolPicture
    from engine.context_kv import TokenInContexts
    from engine.prefix_cache import PolicyReuse, PoolState, PromptHistory
    from engine.prompt import PromptSegment
    from engine.timing import DecodeTiming
    from engine.trace import PrefixHit, SplitKVTrace
    from ui.follow.ask_round import AskRound
    from ui.follow.serving_room import ServingRoom
    from ui.runs.eviction import EvictionPair
    from ui.runs.eviction_forced import ForcedReading
    from ui.runs.eviction_settings import EvictionSettings
    from ui.runs.serving import ServedClass
    from ui.runs.sink_experiment import SinkExperiment
    from ui.runs.speculative import SpeculativeRun


class RunView(Protocol):
    """The run as views and the lesson read it (`ui.runs.runner.Runner` is one): plain data and figures' arrays,
    each named for what it is. `step` counts generated tokens (0: the prompt alone, 1: after the prefill)."""

    # the run's text and tokens
    info: engine.ModelInfo
    prompt_ids: list[int]
    generated: int
    finished: bool
    stop_reason: str | None
    chat: bool
    history: PromptHistory

    def cells(self, step: int) -> list[TokenCell]: ...
    def candidate_cells(self, step: int, candidate_ids: list[int]) -> list[TokenCell]: ...
    def prompt_cells(self, ids: list[int]) -> list[TokenCell]: ...
    def prompt_tail_text(self, keep: int) -> str: ...
    def prompt_segments(self) -> list[PromptSegment]: ...
    def texts(self, step: int) -> tuple[str, str]: ...
    def step_traces(self, step: int) -> list[StepTrace]: ...
    def run_key(self) -> weakref.ref: ...

    # the model's numbers and the host's limits the views quote
    embed_scale: float | None
    max_prompt_tokens: int
    step_memory_mb: int

    def attention_scale(self, layer: int) -> float: ...
    def short_of_memory(self) -> bool: ...
    # attention, the KV cache and its splits
    def heatmap_span(self, step: int) -> tuple[int, int]: ...
    def full_attention(self, step: int, layer: int, head: int): ...
    def cached_kv(self, layer: int, length: int): ...
    def split_demo(self, trace: StepTrace, layer: int, head: int) -> SplitKVTrace: ...
    def token_in_contexts(self, first: str, second: str, word: str) -> TokenInContexts: ...
    # the pool and the prefix cache
    def pool_state(self) -> PoolState: ...
    def busy_pool(self, step: int) -> BusyPoolPicture: ...
    def prefix_hit(self) -> PrefixHit | None: ...
    def blocks_reclaimed(self) -> int: ...
    def policy_reuse(self) -> dict[str, PolicyReuse]: ...
    def closest_cached(self) -> tuple[list[int], int] | None: ...
    # costs, eviction, serving, speculative decoding
    def decode_timing(self, prompt: int, context: int, bandwidth_again: bool = False) -> DecodeTiming: ...
    def eviction_pair(
        self, settings: EvictionSettings, step: int, progress: Callable[[int], None] | None = None
    ) -> tuple[EvictionPair, int]: ...
    def forced_reading(self, answer: list[int], settings: EvictionSettings) -> ForcedReading: ...
    def sink_experiment(self, lang: str) -> SinkExperiment: ...
    def serving(self, state: AppState, served_round=None) -> ServedClass: ...
    def speculative(self, state: AppState) -> SpeculativeRun: ...


@dataclass
class ViewContext:
    runner: RunView
    state: AppState
    step: int  # tokens generated and shown
    trace: StepTrace | None  # the step that produced the newest shown token (None before the prefill)
    stage: str | None = None  # the stage of one step a lesson chapter talks about (viz.step_picture.STAGES)
    measured_again: int = 0  # the page's presses of the costs view's "measure again"
    room: ServingRoom | None = None  # the Serving view's: the class's room of this page, if it leads or follows one
    ask: AskRound | None = None  # the class's round of answers at this step, if the page leads or follows a room
    # The page's answers to a view's presses (a view passes them as its buttons' callbacks; the page's state moves)
    load_case: Callable[[str], None] | None = None  # the prefix view's article case ("case1", "case2")
    measure_again: Callable[[], None] | None = None  # the costs view's timings measured anew
    memo: dict = field(default_factory=dict, repr=False)  # what parts of one draw compute once (the lesson's facts)

    @staticmethod
    def setting_key(name: str) -> str:
        """The widget key of the link's setting `name` (an `AppState` field): a view's widget for it is the setting."""
        return settings.key(name)

    @staticmethod
    def own_key(name: str) -> str:
        """The widget key of a view's own control `name`, which the link does not carry."""
        return view_controls.key(name)

    def t(self, key: str, **values) -> strings.Shown:
        """A string in the page's language, its values shown as text (`ui.text.strings.t`)."""
        return strings.t(key, self.state.lang, **values)

    @property
    def large(self) -> bool:
        return self.state.large

    @property
    def info(self) -> engine.ModelInfo:
        return self.runner.info

    @cached_property
    def cells(self) -> list[TokenCell]:
        """Prompt tokens and the tokens generated so far, in one sequence."""
        return self.runner.cells(self.step)

    @cached_property
    def labels(self) -> list[str]:
        """What each position reads as in figures and tables ("解¹⁄₂" for part 1 of a two-token character)."""
        return [position_label(c) for c in self.cells]

    def served_class(self) -> ServedClass:
        """The class of requests the Serving view shows (`Runner.serving`): the round of the class's questions the
        link names, else the samples. Raises `ui.runs.serving.PoolTooSmall` where the pool cannot serve them."""
        return self.runner.serving(self.state, self.room.served if self.room else None)

    def speculative(self) -> SpeculativeRun:
        """The speculative view's run of the link's settings (`Runner.speculative`). Raises InvalidSettingError where
        the model cannot take them."""
        return self.runner.speculative(self.state)

    def token_text(self, token_id: int) -> str:
        """One token as figures label it: its text with whitespace made visible; part of a character, its bytes."""
        return position_label(self.runner.prompt_cells([token_id])[0])

"""What every view gets: the run (its window onto the engine), the state from the link, the shown step and
its trace. Views read the run only through `Runner`'s concept-named methods."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import engine
from engine.tokens import TokenCell
from engine.trace import StepTrace
from ui.text import strings
from ui.runs.runner import Runner
from ui.state.link import AppState
from viz.tokens import position_label

if TYPE_CHECKING:
    from ui.follow.serving_room import ServingRoom
    from ui.runs.serving import ServedClass


@dataclass
class ViewContext:
    runner: Runner
    state: AppState
    step: int  # tokens generated and shown
    trace: StepTrace | None  # the step that produced the newest shown token (None before the prefill)
    stage: str | None = None  # the stage of one step a lesson chapter talks about (viz.step_picture.STAGES)
    measured_again: int = 0  # the page's presses of the costs view's "measure again"
    room: ServingRoom | None = None  # the Serving view's: the class's room of this page, if it leads or follows one

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

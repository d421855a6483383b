"""What one browser session keeps from one script run to the next, besides its settings (the widget keys
`w_<setting>`, `ui.page.page_state`): one dataclass per concern, each under one session key. The page's own is
`PageSession` (key `page`), the lesson's `LessonSession` (key `lesson`); following's is
`ui.follow.room_link.FollowState` (key `follow`). Views never write them: they get what they show in their
`ViewContext`.
"""

from __future__ import annotations

import threading
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING

import streamlit as st

if TYPE_CHECKING:
    from ui.runs.runner import Runner
    from ui.state.link import Problem


@dataclass(frozen=True)
class PlayClock:
    start: float  # clock() when Play started, or when its pace or step last changed other than by its ticks
    step: int  # the step then
    pace: float
    last: int  # the step Play's last tick set


class OneShot:
    """A dataclass some of whose fields are one-shot: left by one run for the next, which reads each once."""

    def take(self, name: str):
        """Field `name`'s value; the field is back to its default."""
        value, default = getattr(self, name), next(f for f in fields(self) if f.name == name)
        setattr(self, name, default.default_factory() if default.default is MISSING else default.default)
        return value


@dataclass
class PageSession(OneShot):
    step: int = 0  # the step asked for, then the one shown
    runner: Runner | None = None  # this session's view of its run
    # One script run at a time in a session: each press starts a new run and Streamlit stops the old one only at
    # its next Streamlit call, so without it a run could still be inside the engine while the next one moves the
    # step or reconfigures the same run.
    run_lock: threading.RLock = field(default_factory=threading.RLock)
    from_link: bool = False  # the link was read (the session's first run)
    drawn_state: dict = field(default_factory=dict)  # the settings last drawn, by name (`AppState` less the step)
    problems: list[Problem] = field(default_factory=list)  # to show in this run's banner, then dropped
    chat_asked: bool = False  # the link asked for the chat template (a base model then says why it is off)
    full_rerun: bool = False  # a control in the step's fragment changed the rest of the page
    moved: bool = False  # a step button's press moved the step and the live buttons are not drawn yet
    stop_playing: bool = False  # Play goes off before its toggle is drawn
    play_clock: PlayClock | None = None  # Play's clock, while it plays
    counter_html: str | None = None  # the step's header as last drawn: it stays until the next replaces it
    drawn_layout: tuple | None = None  # the (chapter, view) last drawn
    layout_side: bool = False  # the slot each place of the step's layout takes (`ui.page.step.fresh_place`)
    focused_head_chosen: bool = False  # the layer and head pickers were opened on a focused head
    focus_from_chapter: bool = False  # ... for a chapter: the head in the link is the last chapter's
    measured_again: int = 0  # presses of the costs view's "measure again"


@dataclass
class LessonSession(OneShot):
    """What entering a chapter leaves for the run that draws it."""
    pending_case: str | None = None  # an article's case to load (`ui.lesson.cases`)
    chat_before_case: bool | None = None  # the chat switch before a case turned it off
    forget_published: bool = False  # the chapter's run starts from an empty prefix cache
    pending_window_prompt: bool = False  # the window chapter's prompt, once the model is known to have a window


def page_session() -> PageSession:
    return st.session_state.setdefault("page", PageSession())


def lesson_session() -> LessonSession:
    return st.session_state.setdefault("lesson", LessonSession())

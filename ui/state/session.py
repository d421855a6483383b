"""What one browser session keeps from one script run to the next: the one module that touches Streamlit's session
state (tests/test_view_protocol.py).

- Widgets' values, by name, each kind under its key prefix: `settings` (the link's, one per `AppState` field,
  `w_<field>`), `page_controls` (the page's own controls, not in the link: Play and its pace, `p_`) and
  `view_controls` (a view's own, not in the link: `v_`). Buttons are keyed `b_`, expanders `x_`; nothing reads them.
- One dataclass per concern, each under one session key (`kept`): the page's `PageSession` (key `page`), the
  lesson's `LessonSession` (key `lesson`), following's `ui.follow.room_link.FollowState` (key `follow`).
Views read none of it: they get what they show in their `ViewContext`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypeVar

import streamlit as st

from ui.state.link import AppState

if TYPE_CHECKING:
    from ui.state.link import Problem

Kept = TypeVar("Kept")
_UNSET = object()  # a control not set yet (None is a value)


class Controls:
    """The values of one kind of widget in the session, by name (`settings.lang`, `settings["lang"]`): the only
    door to their keys. A widget is drawn with `key=controls.key(name)`."""

    def __init__(self, prefix: str, names: tuple[str, ...] | None = None, journal: bool = False):
        object.__setattr__(self, "_prefix", prefix)
        object.__setattr__(self, "_names", names)  # the names allowed; None: any
        object.__setattr__(self, "_keys", tuple(prefix + name for name in names or ()))
        object.__setattr__(self, "_written_key", "written:" + prefix if journal else None)  # no widget's key

    def key(self, name: str) -> str:
        if self._names is not None and name not in self._names:
            raise KeyError(f"{name!r} is not one of these controls ({self._prefix}…)")
        return self._prefix + name

    def get(self, name: str, default: Any = None) -> Any:
        return st.session_state.get(self.key(name), default)

    def __getitem__(self, name: str) -> Any:
        return st.session_state[self.key(name)]

    def __setitem__(self, name: str, value: Any) -> None:
        st.session_state[self.key(name)] = value
        if self._written_key:
            st.session_state.setdefault(self._written_key, {})[name] = value

    def written(self) -> dict[str, Any]:
        """What the page set since `forget_written`, by name (for the settings: since the page last drew them)."""
        return dict(st.session_state.get(self._written_key, {}))

    def forget_written(self) -> None:
        st.session_state.pop(self._written_key, None)

    def __contains__(self, name: str) -> bool:
        return self.key(name) in st.session_state

    def __getattr__(self, name: str) -> Any:  # only names not found on the object itself: the controls'
        if name.startswith("_"):
            raise AttributeError(name)
        return self[name]

    __setattr__ = __setitem__

    def setdefault(self, name: str, value: Any) -> Any:
        return st.session_state.setdefault(self.key(name), value)

    def values(self) -> dict[str, Any]:
        """The controls set so far, by name (of those named at construction): one look-up each."""
        state = st.session_state
        return {
            name: value
            for name, key in zip(self._names or (), self._keys)
            if (value := state.get(key, _UNSET)) is not _UNSET
        }


SETTING_NAMES = tuple(f.name for f in fields(AppState) if f.name != "step")  # the step is the page's (`PageSession`)
settings = Controls("w_", SETTING_NAMES, journal=True)  # what the page set since it drew (`undo_stale_echoes`)
page_controls = Controls("p_", ("playing", "pace"))
view_controls = Controls("v_")


def kept(key: str, make: Callable[[], Kept]) -> Kept:
    """The session's object for one concern, under `key`, made on its first use."""
    if key not in st.session_state:
        st.session_state[key] = make()
    return st.session_state[key]


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
    runner: object = None  # its view of its run: a `ui.runs.runner.Runner` (the runs sit above this state)
    # What it guards: this page's step and runner, held by one script run at a time. Each press starts a new script
    # run and Streamlit stops the old one only at its next Streamlit call: without it, one could still be inside
    # the engine while the next moves the step or reconfigures the same run.
    page_lock: threading.RLock = field(default_factory=threading.RLock)
    from_link: bool = False  # the link was read (the session's first run)
    drawn_state: dict = field(default_factory=dict)  # the settings last drawn, by name (`AppState` less the step)
    problems: list[Problem] = field(default_factory=list)  # to show in this run's banner, then dropped
    chat_asked: bool = False  # the link asked for the chat template (a base model then says why it is off)
    whole_page_due: bool = False  # a control in the step's fragment changed the rest of the page
    echoes_undone: bool = False  # this run of the whole page has undone its request's echoes: its step need not
    moved: bool = False  # a step button's press moved the step and the live buttons are not drawn yet
    stop_playing: bool = False  # Play goes off before its toggle is drawn
    play_clock: PlayClock | None = None  # Play's clock, while it plays
    counter_html: str | None = None  # the step's header as last drawn: it stays until the next replaces it
    drawn_layout: tuple | None = None  # the (chapter, view) last drawn
    layout_side: bool = False  # the slot each place of the step's layout takes (`ui.page.step_layout.fresh_place`)
    focused_head_chosen: bool = False  # the layer and head pickers were opened on a focused head
    focus_from_chapter: bool = False  # ... for a chapter: the head in the link is the last chapter's
    measured_again: int = 0  # presses of the costs view's "measure again"


@dataclass
class LessonSession(OneShot):
    """What entering a chapter leaves for the run that draws it."""

    pending_case: str | None = None  # an article's case to load (`ui.views.cases`)
    chat_before_case: bool | None = None  # the chat switch before a case turned it off
    forget_published: bool = False  # the chapter's run starts from an empty prefix cache
    pending_window_prompt: bool = False  # the window chapter's prompt, once the model is known to have a window


def page_session() -> PageSession:
    return kept("page", PageSession)


def lesson_session() -> LessonSession:
    return kept("lesson", LessonSession)

"""The parts of a view a lesson chapter can name as its figure (`Part`), and where the page wants them: the chapter's
own place on the projector's first screen, no taller than it allows (`height_limit`, read by figures and tables).
Outside the lesson a part is a container of the view's own."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

import streamlit as st


@dataclass(frozen=True)
class ChapterFigure:
    """The part of a view a lesson chapter talks about, and where the page wants it: on the projector's first
    screen, no taller than `height` px."""

    part: str
    place: object  # a Streamlit container (key `chapter-figure`)
    under: object  # where the controls that set it go (key `chapter-controls`)
    height: int
    whole_view: bool  # the rest of the view is open under the chapter (else only `part` is built)


CHAPTER_FIGURE: ContextVar[ChapterFigure | None] = ContextVar("chapter_figure", default=None)  # set by the page
_MAX_HEIGHT: ContextVar[int | None] = ContextVar("max_height", default=None)  # inside the chapter's part


def height_limit() -> int | None:
    """The px a figure or table drawn now may take (title included): the chapter's part's height, else None."""
    return _MAX_HEIGHT.get()


def shown(part: str | None = None) -> bool:
    """Whether to build `part` of the view (None: what belongs to no part: its other tables, text, metrics). In
    the lesson, while the whole view under the chapter is closed, only the chapter's own part is built: a chapter
    change then draws one figure, not the view's four or five. Controls are drawn either way (cheap, and their
    values live on)."""
    chosen = CHAPTER_FIGURE.get()
    return chosen is None or chosen.whole_view or chosen.part == part


class Part:
    """A place for one part of a view (a figure and what belongs to it), made where the view wants it: the
    chapter's own place when the lesson names this part as its figure, else a container here (keyed `key`, e.g.
    the view's "main-figure"). Entered with `with` to draw the figure; the controls that set it go `under` it, so
    a chapter shows them beside its figure. `shown`: whether the figure is built at all (`shown` above).
    A part whose controls are drawn before its figure holds two places, the figure's above theirs; any other is
    one container (each element is a message to every page on the step, and a React element in each browser)."""

    def __init__(self, name: str, key: str | None = None):
        chosen = CHAPTER_FIGURE.get()
        self.height = chosen.height if chosen is not None and chosen.part == name else None
        if self.height:
            self._place, self._top, self._under = None, chosen.place, chosen.under
        else:
            self._place, self._top, self._under = st.container(key=key), None, None
        self.shown = shown(name)
        self._token = None

    @property
    def under(self):
        if self._under is None:
            if self._top is None:  # the figure is not drawn yet: it gets its place above the controls
                self._top = self._place.container()
            self._under = self._place.container()  # else after the figure, in the part's own place
        return self._under

    def __enter__(self) -> Part:
        if self._top is None:  # nothing drawn under it yet
            self._top = self._place
        self._token = _MAX_HEIGHT.set(self.height)
        self._top.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._top.__exit__(*exc)
        _MAX_HEIGHT.reset(self._token)

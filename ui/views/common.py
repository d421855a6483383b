"""Small helpers the views share: figures with a PNG download, tables, layer/head pickers, and the parts of a
view a lesson chapter can name as its figure."""

from __future__ import annotations

import html
import weakref
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, replace
from time import perf_counter, sleep

import numpy as np
import pandas as pd
import pyarrow as pa
import plotly.graph_objects as go
import streamlit as st

from ui import strings
from ui.context import ViewContext
from ui.follow import turns
from ui.runs import Memo
from viz.attention import focused_head
from viz.style import untitled


def words(ctx: ViewContext) -> dict[str, str]:
    """The words viz functions draw into figures and tables, in the page's language."""
    return strings.figure_words(ctx.state.lang)


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
# When the step's header and text were sent (set by the page; read by the run's first figure, `paint_first`).
TEXT_SENT: ContextVar[float | None] = ContextVar("text_sent", default=None)
# Streamlit's frontend applies the messages that arrive together in one render, and Plotly draws a figure in it
# before anything is painted: figures already made (Back, a follower's step) came with the text and held its paint
# back by their drawing (250-400 ms here). Measured on this machine: 40 ms was not always enough, 60-80 were.
PAINT_GAP = 0.06
_MAX_HEIGHT: ContextVar[int | None] = ContextVar("max_height", default=None)  # inside the chapter's part
TITLE_TEXT_HEIGHT = 72  # px a figure's title takes above it as text: two lines at large text, with its margins


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


# Built figures and tables the server keeps: every page of a class on one step, and the steps just left.
_figures = Memo(64)  # memo key + height limit → (title, figure)
_tables = Memo(32)  # memo key → table


def memo_key(ctx: ViewContext, *parts, per_step: bool = True) -> tuple:
    """What names one figure (or table) of a view: the run (pages with the same settings and prompt history share
    one), the step (unless the figure is the same at every step), everything else the link sets, the chapter's
    stage, and `parts` (what else the view read: pickers, toggles, sliders). The run is held weakly: a figure never
    keeps a dropped run alive, nor matches a newer one."""
    step = ctx.step if per_step else None
    return (weakref.ref(ctx.runner.run), step, replace(ctx.state, step=0), ctx.stage, *parts)


def figure(build: go.Figure | Callable[[], go.Figure], name: str, memo: tuple | None = None) -> None:
    """Draw a figure (viz drew it in the page's language) under its title, which the page sets as text: text wraps
    at any width and text size, a Plotly title is cut. Plotly's toolbar saves the figure as a PNG named `name`.
    In a chapter's figure place, title and figure together are at most that place's height (the width follows
    the column). With `memo` (`memo_key`), `build` is a function run once for every page that shows the same
    figure: a class following one teacher, a step drawn again (Back, a chapter revisited)."""
    limit = _MAX_HEIGHT.get()

    def made() -> tuple[str, go.Figure]:
        return prepared(build() if callable(build) else build, limit)

    title, fig = made() if memo is None else _figures.made((*memo, limit), made)  # shared between pages: only read
    paint_first()
    if title:
        st.markdown(f'<p class="kv-figure-title" style="font-weight:600;margin:0.4rem 0 1rem 0;line-height:1.35">'
                    f"{html.escape(title)}</p>", unsafe_allow_html=True)
    st.plotly_chart(fig, width="stretch", config={"toImageButtonOptions": {"format": "png", "filename": name},
                                                   "displaylogo": False})


def paint_first() -> None:
    """Before the step's first figure: the browser has until `PAINT_GAP` after the step's text was sent to paint
    it (a figure built in that time waits no more)."""
    sent = TEXT_SENT.get()
    if sent is None:
        return
    TEXT_SENT.set(None)
    wait = PAINT_GAP - (perf_counter() - sent)
    if wait > 0:
        with turns.aside():  # a follower's turn goes to the next follower meanwhile
            sleep(wait)


def prepared(fig: go.Figure, limit: int | None) -> tuple[str, go.Figure]:
    """(title, figure without it): at most `limit` px tall with the title's text, its numbers compact, its dict
    made once (`FrozenFigure`)."""
    title = fig.layout.title.text
    if title:
        fig = untitled(fig)
    if limit is not None:
        limit -= TITLE_TEXT_HEIGHT if title else 0
        if (fig.layout.height or 450) > limit:
            fig.update_layout(height=limit)
    compact(fig)
    return title or "", FrozenFigure(fig)


class FrozenFigure(go.Figure):
    """A finished figure whose dict, what `st.plotly_chart` sends, is made once. Plotly's `to_dict` deep-copies
    the whole figure and encodes its arrays on every call: most of the time a page took to draw a memoized figure
    again (Back, a chapter revisited, every page of a class on one step). The dict is shared by the pages that show
    the figure and only read: Streamlit serialises it as it is (trace ids, which Plotly's to_json would pop from
    it, are taken out here)."""

    def __init__(self, fig: go.Figure):
        super().__init__()  # an empty figure: this one is only ever read through to_dict
        shown = fig.to_dict()
        for trace in shown["data"]:
            trace.pop("uid", None)
        self._shown = shown

    def to_dict(self) -> dict:
        return self._shown


def compact(fig: go.Figure) -> None:
    """Send a figure's numbers as float32 (Plotly encodes numpy arrays as typed binary arrays): half the bytes of
    float64 over the wire to every student's browser, and still 7 significant digits, more than any hover shows."""
    for trace in fig.data:
        for name in ("x", "y", "z", "customdata"):
            values = trace[name] if name in trace else None
            if isinstance(values, np.ndarray) and values.dtype == np.float64:
                trace[name] = values.astype(np.float32)


def opened(label: str, key: str):
    """An expander whose content is built only while it is open (opening it redraws the step): what most pages
    never open costs no step anything."""
    return st.expander(label, key=key, on_change="rerun")


def shared_table(build: Callable[[], pd.DataFrame], memo: tuple) -> pa.Table:
    """`build()`'s table, made once for every page that shows it (`memo`: `memo_key`), as `figure` makes figures,
    and already in Arrow, as Streamlit would convert it for each page; shared between pages: only read."""
    return _tables.made(memo, lambda: pa.Table.from_pandas(build()))


def table(frame, key: str | None = None) -> None:
    """A table; in a chapter's figure place, at most that place's height (it scrolls inside)."""
    limit = _MAX_HEIGHT.get()
    height = "auto" if limit is None else min(limit, 35 * (len(frame) + 1) + 3)  # Streamlit's row height: 35 px
    st.dataframe(frame, hide_index=True, width="stretch", key=key, height=height)


def layer_head_pickers(ctx: ViewContext, heads: bool = True) -> tuple[int, int]:
    """Layer (and head) selectors bound to the link's `layer` and `head`."""
    info = ctx.info
    open_on_focused_head(ctx)
    columns = st.columns(2)
    with columns[0]:
        layer = st.number_input(ctx.t("layer"), 0, info.layers - 1, key="w_layer", step=1)
    head = 0
    if heads:
        with columns[1]:
            head = st.number_input(ctx.t("head"), 0, info.q_heads - 1, key="w_head", step=1,
                                   help=ctx.t("head_help", group=info.gqa_group))
    return int(layer), int(head)


def shown_layer_head(ctx: ViewContext) -> tuple[int, int]:
    """The layer and head the view's pickers show (opening on a focused head as they do): what a text drawn
    beside the view, such as the lesson's, quotes, whichever of the two is drawn first."""
    open_on_focused_head(ctx)
    return int(st.session_state.get("w_layer", ctx.state.layer)), int(st.session_state.get("w_head", ctx.state.head))


def open_on_focused_head(ctx: ViewContext) -> None:
    """Once per browser session, when the link chose no layer or head and nobody has picked one, start the
    pickers on a head whose attention shows a pattern (layer 0, head 0 is usually diffuse)."""
    if st.session_state.get("focused_head_chosen") or ctx.trace is None or ctx.trace.attention is None:
        return
    st.session_state["focused_head_chosen"] = True
    if "layer" in st.query_params or "head" in st.query_params or (ctx.state.layer, ctx.state.head) != (0, 0):
        return
    layer, head = focused_head(ctx.trace.attention[:, :, -1].float().numpy())
    st.session_state["w_layer"], st.session_state["w_head"] = layer, head


def titled(ctx: ViewContext, title_key: str) -> bool:
    """The view's title; before the prefill, a hint to run it. True when there is a step to show."""
    st.subheader(ctx.t(title_key))
    if ctx.trace is None:
        st.info(ctx.t("need_prefill"))
        return False
    return True

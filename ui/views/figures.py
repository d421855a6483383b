"""Figures and tables as the views draw them: memoized for every page that shows the same one (`memo_key`), the
figure's title as page text, within the chapter's part's height."""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import replace

import pandas as pd
import plotly.graph_objects as go
import pyarrow as pa
import streamlit as st

from ui.host import press_log
from ui.runs.memo import Memo
from ui.views.chapter_part import height_limit
from ui.views.context import ViewContext
from ui.views.paint import paint_first
from ui.views.wire import FrozenFigure, compact
from viz.style import untitled

TITLE_TEXT_HEIGHT = 72  # px a figure's title takes above it as text: two lines at large text, with its margins
# Built figures and tables the server keeps: every page of a class on one step, and the steps just left.
_figures = Memo(64)  # memo key + height limit → (title, figure)
_tables = Memo(32)  # memo key → table


def memo_key(ctx: ViewContext, *parts, per_step: bool = True) -> tuple:
    """What names one figure (or table) of a view: the run (pages with the same settings and prompt history share
    one), the step (unless the figure is the same at every step), everything else the link sets, the chapter's
    stage, and `parts` (what else the view read: pickers, toggles, sliders). The run is held weakly: a figure never
    keeps a dropped run alive, nor matches a newer one."""
    step = ctx.step if per_step else None
    return (ctx.runner.run_key(), step, replace(ctx.state, step=0), ctx.stage, *parts)


def figure(build: go.Figure | Callable[[], go.Figure], name: str, memo: tuple | None = None) -> None:
    """Draw a figure (viz drew it in the page's language) under its title, which the page sets as text: text wraps
    at any width and text size, a Plotly title is cut. Plotly's toolbar saves the figure as a PNG named `name`.
    In a chapter's figure place, title and figure together are at most that place's height (the width follows
    the column). With `memo` (`memo_key`), `build` is a function run once for every page that shows the same
    figure: a class following one teacher, a step drawn again (Back, a chapter revisited)."""
    limit = height_limit()

    def made() -> tuple[str, go.Figure]:
        with press_log.timed("figures"):
            return prepared(build() if callable(build) else build, limit)

    title, fig = made() if memo is None else _figures.made((*memo, limit), made)  # shared between pages: only read
    paint_first()
    if title:
        st.markdown(
            f'<p class="kv-figure-title" style="font-weight:600;margin:0.4rem 0 1rem 0;line-height:1.35">'
            f"{html.escape(title)}</p>",
            unsafe_allow_html=True,
        )
    st.plotly_chart(
        fig, width="stretch", config={"toImageButtonOptions": {"format": "png", "filename": name}, "displaylogo": False}
    )


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


def shared_table(build: Callable[[], pd.DataFrame], memo: tuple) -> pa.Table:
    """`build()`'s table, made once for every page that shows it (`memo`: `memo_key`), as `figure` makes figures,
    and already in Arrow, as Streamlit would convert it for each page; shared between pages: only read."""

    def made() -> pa.Table:
        with press_log.timed("figures"):
            return pa.Table.from_pandas(build())

    return _tables.made(memo, made)


def table(frame, key: str | None = None) -> None:
    """A table; in a chapter's figure place, at most that place's height (it scrolls inside)."""
    limit = height_limit()
    height = "auto" if limit is None else min(limit, 35 * (len(frame) + 1) + 3)  # Streamlit's row height: 35 px
    st.dataframe(frame, hide_index=True, width="stretch", key=key, height=height)

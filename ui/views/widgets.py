"""The views' shared widgets and words: the view's title, layer/head pickers bound to the link, an expander built
only while open, the figures' words in the page's language."""

from __future__ import annotations

import html
import time
from collections.abc import Callable

import streamlit as st

from ui.text import strings
from ui.views.context import ViewContext

# The views that draw `layer_head_pickers` (tests/test_views_read_state.py checks the list): before they are drawn,
# the step opens the pickers on a focused head (`ui.page.page_state.open_on_focused_head`).
HEAD_VIEWS = frozenset({"attention", "kv", "split", "eviction"})
NOTICE_SECONDS = 0.5  # long work's notice: after this long, and no oftener (each is a message to the page)
clock = time.monotonic  # long work's notice (tests set their own)


def words(ctx: ViewContext) -> dict[str, str]:
    """The words viz functions draw into figures and tables, in the page's language."""
    return strings.figure_words(ctx.state.lang)


def titled(ctx: ViewContext, title_key: str) -> bool:
    """The view's title; before the prefill, a hint to run it. True when there is a step to show."""
    st.subheader(ctx.t(title_key))
    if ctx.trace is None:
        st.info(ctx.t("need_prefill"))
        return False
    return True


def opened(label: str, key: str):
    """An expander whose content is built only while it is open (opening it redraws the step): what most pages
    never open costs no step anything."""
    return st.expander(label, key=key, on_change="rerun")


def layer_head_pickers(ctx: ViewContext, heads: bool = True) -> tuple[int, int]:
    """Layer (and head) selectors bound to the link's `layer` and `head`."""
    info = ctx.info
    columns = st.columns(2)
    with columns[0]:
        layer = st.number_input(ctx.t("layer"), 0, info.layers - 1, key=ctx.setting_key("layer"), step=1)
    head = 0
    if heads:
        with columns[1]:
            head = st.number_input(
                ctx.t("head"),
                0,
                info.q_heads - 1,
                key=ctx.setting_key("head"),
                step=1,
                help=ctx.t("head_help", group=info.gqa_group),
            )
    return int(layer), int(head)


def shown_layer_head(ctx: ViewContext) -> tuple[int, int]:
    """The layer and head the view's pickers show: what a text drawn beside the view, such as the lesson's,
    quotes, whichever of the two is drawn first (the pickers open on the state's)."""
    return int(ctx.state.layer), int(ctx.state.head)


def counter_line(text: str) -> str:
    """The step's header line of a view whose step is its own run's (the Serving view's server steps, the speculative
    view's passes): `text` in bold, as the page's counter."""
    return (
        f'<div class="kv-header" style="font-size:1rem;line-height:1.8">'
        f'<b class="kv-counter">{html.escape(text)}</b></div>'
    )


class ProgressNotice:
    """While long work goes on (a link opened at a late step, a policy's runs catching up), it says how far it got, in
    `place`: `words(done)`, once the work has taken `NOTICE_SECONDS`, and again at most that often. Short work (a
    press's one step) says nothing."""

    def __init__(self, place, words: Callable[[int], str]):
        self.place, self.words, self.since = place, words, clock()
        self.slot = None  # made in `place` at the notice's first words

    def __call__(self, done: int) -> None:
        now = clock()
        if now - self.since < NOTICE_SECONDS:
            return
        if self.slot is None:
            self.slot = self.place.empty()
        self.slot.caption(self.words(done))
        self.since = now

    def clear(self) -> None:
        if self.slot is not None:
            self.slot.empty()

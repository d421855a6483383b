"""The views' shared widgets and words: the view's title, layer/head pickers bound to the link, an expander built
only while open, the figures' words in the page's language."""

from __future__ import annotations

import streamlit as st

from ui import strings
from ui.context import ViewContext
from viz.attention import focused_head


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

"""Small helpers the views share: figures with a PNG download, tables, and layer/head pickers."""

from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st

from ui import strings
from ui.context import ViewContext


def figure(fig: go.Figure, name: str) -> None:
    """Draw a figure in the page's language; Plotly's toolbar saves it as a PNG named `name`."""
    strings.translate_figure(fig, st.session_state.get("w_lang", "en"))
    st.plotly_chart(fig, width="stretch", config={"toImageButtonOptions": {"format": "png", "filename": name},
                                                   "displaylogo": False})


def table(frame, key: str | None = None) -> None:
    st.dataframe(frame, hide_index=True, width="stretch", key=key)


def layer_head_pickers(ctx: ViewContext, heads: bool = True) -> tuple[int, int]:
    """Layer (and head) selectors bound to the link's `layer` and `head`."""
    info = ctx.model.info
    columns = st.columns(2)
    with columns[0]:
        layer = st.number_input(ctx.t("layer"), 0, info.layers - 1, key="w_layer", step=1)
    head = 0
    if heads:
        with columns[1]:
            head = st.number_input(ctx.t("head"), 0, info.q_heads - 1, key="w_head", step=1,
                                   help=ctx.t("head_help", group=info.gqa_group))
    return int(layer), int(head)


def titled(ctx: ViewContext, title_key: str) -> bool:
    """The view's title; before the prefill, a hint to run it. True when there is a step to show."""
    st.subheader(ctx.t(title_key))
    if ctx.trace is None:
        st.info(ctx.t("need_prefill"))
        return False
    return True

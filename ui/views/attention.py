"""Attention over the KV cache: one head's heatmap, all heads of a layer, the newest row, GQA sharing."""

from __future__ import annotations

import streamlit as st

from ui.views.chapter_part import Part, shown
from ui.views.context import ViewContext
from ui.views.figures import figure, memo_key
from ui.views.widgets import layer_head_pickers, titled, words
from viz.attention import gqa_figure, head_grid_figure, heatmap_figure, newest_row_figure


def render(ctx: ViewContext) -> None:
    info = ctx.info
    if not titled(ctx, "attention_title"):
        return
    main = Part("heatmap", key="main-figure")  # the heatmap first; its pickers under it
    with main.under:
        layer, head = layer_head_pickers(ctx)
        show_scores = st.toggle(ctx.t("show_scores"), key=ctx.own_key("scores"))
    value = "s = q·k/√d" if show_scores else "a = softmax(s)"
    labels = ctx.labels
    if main.shown and ctx.runner.short_of_memory():  # the newest row below still shows where this head looked
        with main:
            st.info(ctx.t("short_of_memory", left_out=ctx.t("left_out_heatmap")))
    elif main.shown and (span := ctx.runner.heatmap_span(ctx.step))[0] > span[1]:  # a host's small step memory
        with main:
            st.info(ctx.t("heatmap_over_budget", positions=span[0], limit=span[1]))
    elif main.shown:
        probs, scores = ctx.runner.full_attention(ctx.step, layer, head)
        matrix = (scores if show_scores else probs).float().numpy()  # bfloat16 widens exactly
        with main:
            figure(
                lambda: heatmap_figure(
                    matrix,
                    labels,
                    ctx.t("heatmap_title", layer=layer, head=head, kv=head // info.gqa_group),
                    ctx.large,
                    value_name=value,
                    zmin=None if show_scores else 0.0,
                    words=words(ctx),
                    sliding_window=info.window(layer),
                ),
                f"attention-L{layer}-H{head}",
                memo_key(ctx, "heatmap", layer, head, show_scores),
            )
            st.caption(ctx.t("heatmap_note", n=matrix.shape[0]))
    if info.sliding_window is not None:
        layer_kinds_note(ctx, layer)
    trace = ctx.trace
    # (q_heads, L) as computed
    newest = (trace.scores if show_scores else trace.attention)[layer, :, -1].float().numpy()
    if shown():
        figure(
            lambda: newest_row_figure(
                newest[head], labels[: newest.shape[1]], ctx.t("newest_title", head=head), ctx.large, value
            ),
            f"newest-row-L{layer}-H{head}",
            memo_key(ctx, "newest", layer, head, show_scores),
        )
    if shown("heads"):
        with Part("heads"):
            figure(
                lambda: head_grid_figure(
                    trace.attention[layer, :, -1].float().numpy(),
                    labels[: newest.shape[1]],
                    info.gqa_group,
                    ctx.t("heads_title", layer=layer),
                    ctx.large,
                ),
                f"heads-L{layer}",
                memo_key(ctx, "heads", layer),
            )
    if shown("gqa"):
        with Part("gqa"):
            figure(
                lambda: gqa_figure(
                    info.q_heads,
                    info.kv_heads,
                    ctx.t("gqa_title", q=info.q_heads, kv=info.kv_heads, group=info.gqa_group),
                    ctx.large,
                ),
                "gqa",
                memo_key(ctx, "gqa", per_step=False),
            )


def layer_kinds_note(ctx: ViewContext, layer: int) -> None:
    """Which layers are local (a sliding window) and which global, this one first."""
    info = ctx.info
    kinds = info.layer_kinds
    local = [str(i) for i, kind in enumerate(kinds) if kind == "local"]
    global_ = [str(i) for i, kind in enumerate(kinds) if kind == "global"]
    key = "layer_is_local" if kinds[layer] == "local" else "layer_is_global"
    st.markdown(
        ctx.t(key, layer=layer, w=info.sliding_window)
        + " "
        + ctx.t("layer_kinds_list", local=", ".join(local), global_=", ".join(global_), w=info.sliding_window)
    )

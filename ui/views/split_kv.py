"""Split-KV (FlashDecoding): each split's partial output, max and sum; the merge equals unsplit."""

from __future__ import annotations

import streamlit as st

from engine.split_kv import worked_example
from ui.views.chapter_part import Part, shown
from ui.views.context import ViewContext
from ui.views.figures import figure, memo_key, shared_table, table
from ui.views.widgets import layer_head_pickers, opened, words
from viz.split_kv import merge_table, split_figure, split_table, vector_text, worked_example_frame


def render(ctx: ViewContext) -> None:
    st.subheader(ctx.t("split_title"))
    main = Part("split", key="main-figure")  # the split figure first, filled once its pickers are drawn
    if shown():
        introduction(ctx)
    if ctx.trace is None:
        st.info(ctx.t("need_prefill"))
        return
    with main.under:
        layer, head = layer_head_pickers(ctx)
    if ctx.trace.split is not None:  # the run itself attended in splits
        split, at = ctx.trace.split, (layer, head)
    elif ctx.trace.scores is not None:  # an unsplit run: the same maths replayed over the recorded scores
        split, at = ctx.runner.split_demo(ctx.trace, layer, head), (0, 0)
        st.info(ctx.t("split_demo", splits=len(split.ranges)))
    else:
        st.info(ctx.t("split_off"))
        return
    if shown():
        c1, c2, c3 = st.columns(3)
        c1.metric(ctx.t("splits"), len(split.ranges))
        c2.metric(ctx.t("cached_positions"), ctx.trace.context_length)
        c3.metric(ctx.t("max_diff"), f"{split.max_abs_diff[at].item():.1e}")
        table(shared_table(lambda: split_table(split, *at, words(ctx)), memo_key(ctx, "split-table", layer, head)))
    if main.shown:
        with main:
            figure(
                lambda: split_figure(split, *at, ctx.t("split_fig", layer=layer, head=head), ctx.large, words(ctx)),
                f"split-L{layer}-H{head}",
                memo_key(ctx, "split", layer, head),
            )
    if shown():
        with opened(ctx.t("merge_table"), "x_merge") as box:
            if box.open:
                table(shared_table(lambda: merge_table(split, *at, words(ctx)), memo_key(ctx, "merge", layer, head)))


def introduction(ctx: ViewContext) -> None:
    """What split-KV does, and a worked example small enough to follow by hand."""
    st.markdown(ctx.t("split_intro"))
    with st.expander(ctx.t("example_title"), expanded=ctx.trace is None):
        example = worked_example()
        st.markdown(ctx.t("example_setup", q=example.query, keys=example.keys, values=example.values))
        table(shared_table(lambda: worked_example_frame(example, words(ctx)), memo_key(ctx, "example", per_step=False)))
        st.markdown(
            ctx.t(
                "example_result",
                merged=vector_text(example.merged, 3),
                unsplit=vector_text(example.unsplit, 3),
                diff=max(abs(a - b) for a, b in zip(example.merged, example.unsplit)),
            )
        )

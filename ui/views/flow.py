"""One step, end to end: id → embedding row → layers (two residual adds each) → logits → new id → two paths."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from ui.text import strings
from ui.views.chapter_part import Part, shown
from ui.views.context import ViewContext
from ui.views.figures import figure, memo_key, shared_table
from ui.views.widgets import titled, words
from viz.flow import flow_rows, residual_figure, vector_figure
from viz.step_picture import MIN_WIDTH, step_figure

# Narrower than MIN_WIDTH (a phone) the picture keeps its size and scrolls sideways rather than squeezing its words
# together; the page itself does not widen. Part of the page's style (`ui.page.main`), not sent again with every step.
PICTURE_CSS = f"<style>.st-key-step-picture [data-testid='stFullScreenFrame'] {{ min-width: {MIN_WIDTH}px; }}</style>"


def render(ctx: ViewContext) -> None:
    info = ctx.info
    if not titled(ctx, "flow_title"):
        return
    trace = ctx.trace
    if shown("picture"):
        with Part("picture", key="main-figure"), st.container(key="step-picture"):  # the picture of the step first
            figure(
                lambda: step_figure(trace, info, ctx.stage, picture_title(ctx), ctx.large, words(ctx)),
                "one-step",
                memo_key(ctx, "picture"),
            )
    if shown("residuals"):
        with Part("residuals"):
            figure(
                lambda: residual_figure(
                    trace.residual.float().numpy(),
                    ctx.t("residual_title", adds=2 * info.layers),
                    ctx.large,
                    words(ctx),
                    post_norms=len(info.layer_norms) == 4,
                ),
                "residual-stream",
                memo_key(ctx, "residuals"),
            )
    if shown():
        dual_path(ctx)
    if shown("vectors"):
        vectors(ctx)


def dual_path(ctx: ViewContext) -> None:
    """The step's stages as a table (shapes, what happens), then the new id's two paths."""
    info, trace = ctx.info, ctx.trace
    # hide_index named: Streamlit would convert the Arrow table to pandas on every draw to see if it has an index
    st.table(shared_table(lambda: stages_table(ctx), memo_key(ctx, "stages")), hide_index=False)
    new = ctx.cells[-1]
    paths = st.container(horizontal=True, key="dual-path")  # halves (page CSS): one element where columns are three
    paths.markdown(ctx.t("path_text", id=trace.token_id, text=new.text, piece=trace.text or "∅"))
    paths.markdown(ctx.t("path_embedding", id=trace.token_id, vocab=info.vocab, hidden=info.hidden))
    st.caption(ctx.t("flow_note"))


def stages_table(ctx: ViewContext) -> pd.DataFrame:
    """The step's stages, a row each: what it does and the shape it makes, in the page's language."""
    info = ctx.info
    rows = []
    post = len(info.layer_norms) == 4  # Gemma 3: each branch's output is normalised too, before its add
    for r in flow_rows(ctx.trace, info):
        facts = {k: ctx.t("yes" if v else "no") if isinstance(v, bool) else v for k, v in r.facts.items()}
        note = "flow_note_" + r.key
        note += "_post" if post and note + "_post" in strings.ENGLISH else ""
        rows.append(
            {
                ctx.t("flow_stage"): ctx.t("flow_stage_" + r.key, **facts),
                ctx.t("flow_shape"): r.shape,
                ctx.t("flow_note_col"): ctx.t(note, **facts),
            }
        )
    return pd.DataFrame(rows).set_index(ctx.t("flow_stage"))


def vectors(ctx: ViewContext) -> None:
    """The last layer's output beside the next step's input: two different vectors."""
    info, trace = ctx.info, ctx.trace
    # GPT-2's next input is its token row plus a learned position row; RoPE families take the token row alone.
    next_label = ctx.t(
        "vec_next_learned" if info.positions == "learned" else "vec_next",
        id=trace.token_id,
        position=trace.positions[-1] + 1,
    )
    shown_vectors = {
        ctx.t("vec_final"): trace.final_hidden.float().numpy(),
        next_label: trace.next_input_embedding.float().numpy(),
    }
    with Part("vectors"):
        figure(
            lambda: vector_figure(shown_vectors, ctx.t("vectors_title"), ctx.large, words(ctx)),
            "final-vs-next-input",
            memo_key(ctx, "vectors"),
        )
        different = float(np.abs(shown_vectors[ctx.t("vec_final")] - shown_vectors[next_label]).max())
        st.caption(ctx.t("vectors_note", diff=different))


def picture_title(ctx: ViewContext) -> str:
    """ "Step 5 (decode): id 1234 in → id 314 out" (prefill: how many prompt ids went in)."""
    trace = ctx.trace
    if trace.phase == "prefill":
        return ctx.t("picture_title_prefill", step=ctx.step, n=len(trace.input_ids), output=trace.token_id)
    return ctx.t("picture_title_decode", step=ctx.step, input=trace.input_ids[0], output=trace.token_id)

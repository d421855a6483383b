"""Always shown: the step counter with this step's input and output tokens, the phase, the token stream; and,
under the view, the text so far and the candidates for the output token."""

from __future__ import annotations

import html
import json

import streamlit as st

from ui.views.chapter_part import shown
from ui.views.context import ViewContext
from ui.views.figures import figure, memo_key, shared_table
from ui.views.widgets import opened, words
from viz.candidates import candidates_figure, candidates_table
from viz.tokens import (
    position_label,
    reads_as,
    splits_characters,
    token_chip_styles,
    token_frame,
    token_legend_html,
    token_stream_html,
)

TEMPLATE_STYLE = "background:#8882;border:1px dashed #888;border-radius:4px;color:#666"


def phase_line(ctx: ViewContext) -> str:
    n = len(ctx.runner.prompt_ids)
    if ctx.step == 0:
        return ctx.t("phase_ready", n=n)
    trace = ctx.trace
    if trace.phase == "prefill":
        reused = trace.prefix.reused_tokens if trace.prefix else 0
        return ctx.t("phase_prefill", n=len(trace.input_ids), reused=reused)
    window = ctx.info.sliding_window
    if window is not None and trace.context_length > window:  # Gemma 3: its local layers read only their window
        return ctx.t("phase_decode_window", position=trace.positions[0], length=trace.context_length, window=window)
    return ctx.t("phase_decode", position=trace.positions[0], length=trace.context_length)


def counter_text(ctx: ViewContext) -> str:
    """The header's counter, e.g. "step 8 · decode · position 43": the step, its phase, the position(s) that went in."""
    trace = ctx.trace
    if trace is None:
        return ctx.t("counter_ready", step=ctx.step)
    if trace.phase == "prefill":
        return ctx.t("counter_prefill", step=ctx.step, first=trace.positions[0], last=trace.positions[-1])
    return ctx.t("counter_decode", step=ctx.step, position=trace.positions[0])


def input_positions(ctx: ViewContext) -> range:
    """The positions whose tokens went into this step: the whole prompt at the prefill, one token after."""
    trace = ctx.trace
    return range(0) if trace is None else range(trace.positions[0], trace.positions[-1] + 1)


def counter_html(ctx: ViewContext) -> str:
    """The header line: the step counter, then this step's input token(s) and its output token, as the chips
    of the token stream draw them. Escaped: tokens are the user's and the model's text."""
    size = "1rem"
    line = f'<b class="kv-counter">{html.escape(counter_text(ctx))}</b>'
    inputs = input_positions(ctx)
    if inputs:  # a decode step feeds one token; the prefill, every prompt token not reused from the cache
        cell = ctx.cells[inputs[0]]
        went_in = (
            f'<span class="kv-chip kv-{cell.kind} kv-input">{html.escape(position_label(cell))}</span>'
            if len(inputs) == 1
            else html.escape(ctx.t("io_prompt_tokens", n=len(inputs)))
        )
        out = ctx.cells[-1]
        line += (
            f' &nbsp;·&nbsp; {html.escape(ctx.t("io_input"))} {went_in} → {html.escape(ctx.t("io_output"))} '
            f'<span class="kv-chip kv-newest">{html.escape(position_label(out))}</span>'
        )
    return (
        f"<style>.kv-header .kv-chip{{font-size:{size}}}{token_chip_styles(size)}</style>"
        f'<div class="kv-header" style="font-size:{size};line-height:1.8">{line}</div>'
    )


def render(ctx: ViewContext, lines: int | None = None) -> None:
    """Under the step buttons: what the step did, and the token stream (a few lines, or `lines`, scrolling)."""
    if lines is None:  # the lesson's header line already names the step and its phase
        st.markdown(f"**{phase_line(ctx)}**")
    if ctx.runner.finished and ctx.step == ctx.runner.generated:
        st.info(ctx.t("stopped_" + ctx.runner.stop_reason))
    labels = {kind: ctx.t("legend_" + kind) for kind in ("prompt", "generated", "input")} | {
        "newest": ctx.t("legend_output")
    }
    if lines is not None:  # a strip of the newest tokens (the lesson's): no room for the legend
        legend = ""
    elif splits_characters(ctx.cells):  # byte-level BPE explained where a character made of several tokens shows
        legend = token_legend_html(labels, ctx.t("legend_hover_bpe"), ctx.t("bpe_explained"))
    else:
        legend = token_legend_html(labels, ctx.t("legend_hover"))
    with st.container(key="token-stream"):  # HTML set as it is: no Markdown parse of ~150 bytes a token per step
        st.html(token_stream_html(ctx.cells, ctx.large, input_positions(ctx), legend, lines, words(ctx)))


def details(ctx: ViewContext) -> None:
    """Under the view: the text so far, and the candidates for this step's output token (in the lesson, the text
    alone until the whole view is opened)."""
    if not shown():
        text_so_far(ctx)
        return
    left, right = st.columns([3, 2])
    with left:
        text_so_far(ctx)
        if st.toggle(ctx.t("show_template"), key=ctx.own_key("show_template"), help=ctx.t("show_template_help")):
            wrapped_prompt(ctx)
    with right:
        if ctx.trace is None:
            return
        st.markdown(f"**{ctx.t('candidates_title', token=reads_as(ctx.cells[-1]))}**")
        ids = [c.token_id for c in ctx.trace.candidates]
        labels = [position_label(c) for c in ctx.runner.candidate_cells(ctx.step, ids)]  # "解²⁄₂", never "�"
        # the drawn ✓ first: a narrow column never hides it
        frame = shared_table(lambda: candidates_table(ctx.trace, words(ctx), labels), memo_key(ctx, "candidates"))
        st.dataframe(frame, hide_index=True, key="candidates", height=36 * (len(frame) + 1) + 4)
        with opened(ctx.t("candidates_fig"), "x_candidates") as box:
            if box.open:
                figure(
                    lambda: candidates_figure(ctx.trace, ctx.t("candidates_fig"), ctx.large, words(ctx), labels),
                    "candidates",
                    memo_key(ctx, "candidates"),
                )
        downloads(ctx)


def text_so_far(ctx: ViewContext) -> None:
    """The prompt and the answer so far, as plain text (container `generated`)."""
    prompt, answer = ctx.runner.texts(ctx.step)
    with st.container(key="generated"):
        # st.code keeps the text exactly (st.text would dedent and strip it); it drops one leading and one
        # trailing newline, so we add them.
        st.code("\n" + prompt + answer + "\n", language=None, wrap_lines=True)


def wrapped_prompt(ctx: ViewContext) -> None:
    """The prompt as the model reads it: the chat template's text boxed in grey, the user's text plain.

    st.html renders no Markdown or LaTeX, and every piece is escaped, so the user's text shows as text.
    """
    pieces = []
    for segment in ctx.runner.prompt_segments():
        style = TEMPLATE_STYLE if segment.kind == "template" else ""
        pieces.append(f'<span class="kv-{segment.kind}" style="{style}">{html.escape(segment.text)}</span>')
    st.html(f'<div style="font-family:monospace;white-space:pre-wrap;line-height:1.9">{"".join(pieces)}</div>')
    st.caption(ctx.t("template_legend" if ctx.runner.chat else "template_off"))


def downloads(ctx: ViewContext) -> None:
    """The files are built only when clicked (a trace's JSON runs to megabytes)."""
    trace, cells = ctx.trace, ctx.cells
    row = st.container(horizontal=True)
    row.download_button(
        ctx.t("download_trace"),
        lambda: json.dumps(trace.to_dict(), ensure_ascii=False),
        file_name=f"kvscope-step-{ctx.step}.json",
        mime="application/json",
        key="dl_trace",
    )
    row.download_button(
        ctx.t("download_tokens"),
        lambda: token_frame(cells).to_csv(index=False),
        file_name=f"kvscope-tokens-step-{ctx.step}.csv",
        mime="text/csv",
        key="dl_tokens",
    )

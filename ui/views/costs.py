"""Costs: the bytes a decode step reads for a batch, steady timings beside their floor, time and K/V per step
as the run went, and the context limit."""

from __future__ import annotations

import streamlit as st

from engine.reference_models import reference_info
from engine.timing import DecodeTiming, crossover_batch, crossover_context, decode_step_bytes, weight_bytes_read
from ui.views.chapter_part import Part, shown
from ui.views.context import ViewContext
from ui.views.figures import figure, memo_key, shared_table, table
from ui.views.widgets import words
from viz.costs import (
    attention_scores,
    context_growth_figure,
    context_growth_frame,
    growth_lengths,
    kv_read_figure,
    per_token_figure,
    step_bytes_figure,
    step_times_figure,
    steps_frame,
    steps_table,
)
from viz.style import fmt_ms, fmt_size

REFERENCE = "Qwen3-0.6B"  # the articles' model, beside the loaded one
MAX_BATCH = 64
MEASURE_TTL_S = 120  # pages opening the chapter together share one measurement for this long
TIMING_EVERY = 64  # positions: the steady timings are measured at the context rounded down to a multiple of this


def render(ctx: ViewContext) -> None:
    info = ctx.info
    st.subheader(ctx.t("costs_title"))
    traces = ctx.runner.step_traces(ctx.step)
    w = words(ctx)
    if not traces:
        st.info(ctx.t("need_prefill"))
    else:
        step_bytes(ctx, traces[-1].context_length)
        if shown():
            per_token(ctx, traces[-1].context_length)
            frame = steps_frame(traces, info)
            figure(
                lambda: step_times_figure(frame, ctx.t("times_title"), ctx.large, w),
                "step-times",
                memo_key(ctx, "times"),
            )
            if (frame["phase"] == "decode").any():
                figure(
                    lambda: kv_read_figure(frame, info.layers, ctx.t("reads_title", layers=info.layers), ctx.large, w),
                    "kv-read-per-step",
                    memo_key(ctx, "reads"),
                )
            table(shared_table(lambda: steps_table(frame, w), memo_key(ctx, "steps")))
            st.caption(ctx.t("costs_note", layers=info.layers))
    limit = info.context_limit
    window = info.sliding_window
    n = len(ctx.runner.prompt_ids)
    growth = Part("growth")  # the chart, and under it the slider that cuts the prompt
    if growth.shown:
        with growth:
            figure(
                lambda: context_growth_figure(
                    context_growth_frame(info, growth_lengths(info)),
                    limit,
                    ctx.t("growth_title" if window is None else "growth_title_window"),
                    ctx.large,
                    w,
                    window,
                ),
                "context-growth",
                memo_key(ctx, "growth", per_step=False),
            )
    with growth.under:
        keep = (
            st.slider(
                ctx.t("truncate_keep"), 1, n, key=ctx.own_key("keep"), value=max(1, n // 2), persist_state="session"
            )
            if n > 2
            else None
        )
        if growth.shown:
            truncation(ctx, limit, n, keep)


def truncation(ctx: ViewContext, limit: int, n: int, keep: int | None) -> None:
    """The context limit, and what cutting the prompt to its last `keep` tokens would keep and save."""
    info = ctx.info
    st.markdown(
        ctx.t(
            "limit_text", limit=limit, n=n, app_limit=ctx.runner.max_prompt_tokens, kib=info.kv_bytes_per_token / 1024
        )
    )
    if keep is not None:
        st.markdown(
            ctx.t(
                "truncate_result",
                dropped=n - keep,
                keep=keep,
                kib=info.kv_bytes(keep) / 1024,
                work=100 * attention_scores(info, keep) / attention_scores(info, n),
            )
        )
        st.code("…" + ctx.runner.prompt_tail_text(keep), language=None, wrap_lines=True)


def step_bytes(ctx: ViewContext, context: int) -> None:
    """What one decode step reads for a batch of B requests (the slider), this model beside Qwen3-0.6B."""
    info, qwen = ctx.info, reference_info(REFERENCE)
    chart = Part("step_bytes", key="main-figure")  # the figure first; its slider under it
    with chart.under:
        batch = st.slider(
            ctx.t("batch_slider"),
            1,
            MAX_BATCH,
            key=ctx.own_key("batch"),
            value=1,
            persist_state="session",
            help=ctx.t("batch_help"),
        )
    if not chart.shown:
        return
    models = [(ctx.t("bytes_this_model"), info), (f"{REFERENCE} ({qwen.dtype})", qwen)]
    with chart:
        figure(
            lambda: step_bytes_figure(
                models, batch, context, ctx.t("step_bytes_title", batch=batch, context=context), ctx.large, words(ctx)
            ),
            "step-bytes",
            memo_key(ctx, "step_bytes", batch),
        )
    lines = [
        ctx.t(
            "bytes_line",
            model=label,
            weights=fmt_size(weight_bytes_read(m)),
            kv=fmt_size(batch * m.kv_bytes(context)),
            total=fmt_size(decode_step_bytes(m, context, batch)),
            batch=batch,
            context=f"{context:,}",
            cross_batch=f"{crossover_batch(m, context):,}",
            cross_context=f"{crossover_context(m, batch):,}",
            limit=f"{m.context_limit:,}",
        )
        for label, m in models
    ]
    st.markdown("\n".join(f"- {line}" for line in lines))


@st.cache_data(ttl=MEASURE_TTL_S, max_entries=16, show_spinner=False)
def _timing(_ctx: ViewContext, model: str, prompt: int, context: int, again: int) -> DecodeTiming:
    """One measurement per (model, lengths) for MEASURE_TTL_S, shared by the pages asking; `again` counts a
    page's "measure again" presses, so a press measures anew (the server's bandwidth too)."""
    return _ctx.runner.decode_timing(prompt, context, bandwidth_again=again > 0)


def per_token(ctx: ViewContext, context: int) -> None:
    """Prefill vs decode per token, measured now (steady, with their spread), beside decode's floor."""
    again = ctx.measured_again
    prompt = len(ctx.runner.prompt_ids)
    at = max(prompt, context - context % TIMING_EVERY)  # a step press does not start a new measurement
    if ctx.runner.short_of_memory():  # a measurement's scratch pool and passes: left for a quieter moment
        st.info(ctx.t("short_of_memory", left_out=ctx.t("left_out_timing")))
        return
    with st.spinner(ctx.t("measuring")):
        timing = _timing(ctx, ctx.info.name, prompt, at, again)
    figure(
        lambda: per_token_figure(timing, ctx.t("per_token_title"), ctx.large, words(ctx)),
        "per-token",
        memo_key(ctx, "per_token", timing, per_step=False),
    )  # one measurement (by value), one figure
    low, high = timing.decode_spread
    c1, c2, c3 = st.columns(3)
    c1.metric(
        ctx.t("decode_step"),
        fmt_ms(timing.decode_median),
        help=ctx.t("decode_step_help", n=len(timing.decode_ms), low=fmt_ms(low), high=fmt_ms(high)),
    )
    c2.metric(ctx.t("bandwidth"), f"{timing.bandwidth / 1e9:,.1f} GB/s", help=ctx.t("bandwidth_help"))
    c3.metric(
        ctx.t("memory_floor"),
        fmt_ms(timing.floor_ms) if timing.floor_holds else "–",
        help=ctx.t("floor_help", bytes=fmt_size(timing.step_bytes), context=timing.decode_context),
    )
    if not timing.floor_holds:
        st.warning(ctx.t("floor_not_below", floor=fmt_ms(timing.floor_ms), fastest=fmt_ms(min(timing.decode_ms))))
    st.markdown(
        ctx.t(
            "bound_text",
            prefill=fmt_ms(timing.prefill_ms_per_token),
            n=timing.prompt,
            tries=len(timing.prefill_ms),
            decode=fmt_ms(timing.decode_median),
            low=fmt_ms(low),
            high=fmt_ms(high),
            steps=len(timing.decode_ms),
            bytes=fmt_size(timing.step_bytes),
            floor=fmt_ms(timing.floor_ms) if timing.floor_holds else "–",
        )
    )
    st.button(ctx.t("measure_again"), key="b_measure_again", on_click=ctx.measure_again)

"""Costs: time per step, prefill versus decode, K/V read per decode step, and the context limit."""

from __future__ import annotations

import streamlit as st

from engine.timing import memory_bandwidth
from engine.trace import StepTrace
from ui.context import ViewContext
from ui.views.common import figure, table, words
from viz.costs import (context_growth_figure, context_growth_frame, kv_read_figure, per_token_figure, steady_costs,
                       step_times_figure, steps_frame, steps_table)
from viz.style import fmt_bytes, fmt_ms, fmt_size


def render(ctx: ViewContext) -> None:
    info = ctx.info
    st.subheader(ctx.t("costs_title"))
    traces = ctx.runner.step_traces(ctx.step)
    w = words(ctx)
    if traces:
        per_token(ctx, traces, w)
        frame = steps_frame(traces, info)
        figure(step_times_figure(frame, ctx.t("times_title"), ctx.large, w), "step-times")
        if (frame["phase"] == "decode").any():
            figure(kv_read_figure(frame, info.layers, ctx.t("reads_title", layers=info.layers), ctx.large, w),
                   "kv-read-per-step")
        table(steps_table(frame, w))
        st.caption(ctx.t("costs_note", layers=info.layers))
    else:
        st.info(ctx.t("need_prefill"))
    limit = info.context_limit
    lengths = sorted({max(1, limit * i // 16) for i in range(17)})
    figure(context_growth_figure(context_growth_frame(info, lengths), limit, ctx.t("growth_title"), ctx.large, w),
           "context-growth")
    n = len(ctx.runner.prompt_ids)
    st.markdown(ctx.t("limit_text", limit=limit, n=n, app_limit=ctx.runner.config.max_prompt_tokens,
                      kib=info.kv_bytes_per_token / 1024))
    if n > 2:
        keep = st.slider(ctx.t("truncate_keep"), 1, n, key="w_keep", value=max(1, n // 2), persist_state="session")
        st.markdown(ctx.t("truncate_result", dropped=n - keep, keep=keep,
                          kib=keep * info.kv_bytes_per_token / 1024,
                          work=100 * keep * (keep + 1) / (n * (n + 1))))
        st.code("…" + ctx.runner.prompt_tail_text(keep), language=None, wrap_lines=True)


def per_token(ctx: ViewContext, traces: list[StepTrace], w: dict[str, str]) -> None:
    """Prefill vs decode per token, and decode against the floor its bytes set at this machine's bandwidth."""
    costs = steady_costs(traces, ctx.info, memory_bandwidth())
    with st.container(key="main-figure"):
        figure(per_token_figure(costs, ctx.t("per_token_title"), ctx.large, w), "per-token")
    c1, c2, c3 = st.columns(3)
    c1.metric(ctx.t("decode_bytes"), fmt_size(costs.decode_bytes),
              help=ctx.t("decode_bytes_help", weights=fmt_bytes(costs.weight_bytes), kv=fmt_bytes(costs.kv_bytes),
                         context=costs.context))
    c2.metric(ctx.t("bandwidth"), f"{costs.bandwidth / 1e9:,.1f} GB/s", help=ctx.t("bandwidth_help"))
    c3.metric(ctx.t("memory_floor"), fmt_ms(costs.floor_ms),
              delta=None if costs.decode_ms_median is None else ctx.t("measured", ms=fmt_ms(costs.decode_ms_median)),
              delta_color="off", delta_arrow="off")
    st.markdown(ctx.t("bound_text", prefill=fmt_ms(costs.prefill_ms_per_token), n=costs.prefill_tokens,
                      decode="–" if costs.decode_ms_median is None else fmt_ms(costs.decode_ms_median),
                      floor=fmt_ms(costs.floor_ms)))

"""Costs: time per step, prefill versus decode, K/V read per decode step, and the context limit."""

from __future__ import annotations

import streamlit as st

from ui.context import ViewContext
from ui.views.common import figure, table
from viz.costs import context_growth_figure, context_growth_frame, kv_read_figure, step_times_figure, steps_frame


def render(ctx: ViewContext) -> None:
    info = ctx.model.info
    st.subheader(ctx.t("costs_title"))
    traces = ctx.runner.session.traces[: ctx.step]
    if traces:
        frame = steps_frame(traces, info)
        figure(step_times_figure(frame, ctx.t("times_title"), ctx.large), "step-times")
        if (frame["phase"] == "decode").any():
            figure(kv_read_figure(frame, info.layers, ctx.t("reads_title", layers=info.layers), ctx.large),
                   "kv-read-per-step")
        table(frame)
        st.caption(ctx.t("costs_note", layers=info.layers))
    else:
        st.info(ctx.t("need_prefill"))
    limit = info.context_limit
    lengths = sorted({max(1, limit * i // 16) for i in range(17)})
    figure(context_growth_figure(context_growth_frame(info, lengths), limit, ctx.t("growth_title"), ctx.large),
           "context-growth")
    n = len(ctx.runner.prompt_ids)
    st.markdown(ctx.t("limit_text", limit=limit, n=n, app_limit=ctx.runner.config.max_prompt_tokens,
                      kib=info.kv_bytes_per_token / 1024))
    if n > 2:
        keep = st.slider(ctx.t("truncate_keep"), 1, n, key="w_keep", value=max(1, n // 2), persist_state="session")
        kept = ctx.runner.prompt_ids[n - keep:]
        st.markdown(ctx.t("truncate_result", dropped=n - keep, keep=keep,
                          kib=keep * info.kv_bytes_per_token / 1024,
                          work=100 * keep * (keep + 1) / (n * (n + 1))))
        st.code("…" + ctx.model.tokenizer.decode(kept), language=None, wrap_lines=True)

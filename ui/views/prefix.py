"""Prefix caching: edit the prompt, prefill again, and see what each policy reuses."""

from __future__ import annotations

import streamlit as st

from ui.context import ViewContext
from ui.views.common import figure, table, words
from viz.prefix import alignment_frame, alignment_table, hits_figure, policy_frame, policy_table
from viz.tokens import token_cells, visible

CASE_CACHED = "解释什么是Transformer"
CASES = {"case1": "解释什么是Transformer，举个例子", "case2": "解释什么是大语言模型"}


def render(ctx: ViewContext) -> None:
    st.subheader(ctx.t("prefix_title"))
    st.markdown(ctx.t("prefix_intro"))
    c1, c2 = st.columns(2)
    c1.button(ctx.t("case1"), key="case1", on_click=load_case, args=("case1",))
    c2.button(ctx.t("case2"), key="case2", on_click=load_case, args=("case2",))
    if ctx.step == 0:
        st.info(ctx.t("need_prefill"))
        return
    prefill = ctx.runner.session.traces[0]
    hit = prefill.prefix
    n = len(ctx.runner.prompt_ids)
    m1, m2, m3 = st.columns(3)
    m1.metric(ctx.t("reused"), hit.reused_tokens)
    m2.metric(ctx.t("computed"), hit.computed_tokens)
    m3.metric(ctx.t("first_difference"), "–" if hit.first_difference is None else hit.first_difference)
    policy = ctx.t("policy_" + hit.policy)
    figure(hits_figure(hit.hits, hit.unit, ctx.state.block_size, ctx.t("hits_title", policy=policy), ctx.large,
                       words(ctx)),
           "prefix-hits")
    st.markdown(ctx.t("policies_title"))
    table(policy_table(policy_frame(ctx.runner.policy_reuse(), n), words(ctx)))
    st.caption(ctx.t("policies_note"))
    cached = ctx.runner.closest_cached()
    if cached is None:
        st.caption(ctx.t("nothing_cached"))
        return
    tokenizer = ctx.model.tokenizer
    cached_labels = [visible(c.text) for c in token_cells(tokenizer, cached, [])]
    new_labels = ctx.labels[:n]
    table(alignment_table(alignment_frame(cached, ctx.runner.prompt_ids, cached_labels, new_labels, hit.reused_tokens),
                          words(ctx)))
    st.caption(ctx.t("evictions", count=len(ctx.runner.cache.evictions)))


def load_case(which: str) -> None:
    """Publish the article's cached prompt, then load the edited one: the next prefill looks it up."""
    st.session_state["pending_case"] = which

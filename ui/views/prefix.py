"""Prefix caching: edit the prompt, prefill again, and see what each policy reuses."""

from __future__ import annotations

import streamlit as st

from ui.views.cases import CASE_BLOCK_SIZE
from ui.views.chapter_part import Part, shown
from ui.views.context import ViewContext
from ui.views.figures import figure, memo_key, table
from ui.views.widgets import words
from viz.prefix import alignment_frame, alignment_table, policies_figure, policy_frame, policy_table
from viz.tokens import position_label

HEADLINE_ORDER = ("whole", "block", "radix")  # the article's rule first


def render(ctx: ViewContext) -> None:
    st.subheader(ctx.t("prefix_title"))
    c1, c2 = st.columns(2)
    c1.button(ctx.t("case1"), key="case1", on_click=ctx.load_case, args=("case1",))
    c2.button(ctx.t("case2"), key="case2", on_click=ctx.load_case, args=("case2",))
    main = Part("policies", key="main-figure")  # the headline first, the introduction under it
    if shown():
        st.markdown(ctx.t("prefix_intro"))
    if ctx.step == 0:
        st.info(ctx.t("need_prefill"))
        return
    n = len(ctx.runner.prompt_ids)
    if main.shown:
        with main:  # the headline: the three policies side by side
            ordered = policies_side_by_side(ctx)
    if shown():
        st.caption(
            ctx.t("case_block_note", size=ctx.state.block_size, case_size=CASE_BLOCK_SIZE)
            + " "
            + ctx.t("policies_note")
        )
        with st.expander(ctx.t("policies_title")):
            table(policy_table(policy_frame({p: r.reused_tokens for p, r in ordered.items()}, n), words(ctx)))
    if shown("alignment"):
        this_run(ctx, n)
    if shown():
        st.caption(ctx.t("reclaimed", count=ctx.runner.blocks_reclaimed(), kept=ctx.runner.history.limit))


def this_run(ctx: ViewContext, n: int) -> None:
    """What this run's prefill reused, and the alignment with the closest published prompt."""
    hit = ctx.runner.prefix_hit()
    closest = ctx.runner.closest_cached()  # the same history the policy comparison replays
    if shown():
        st.markdown(ctx.t("this_run", policy=ctx.t("policy_" + hit.policy)))
        m1, m2, m3 = st.columns(3)
        m1.metric(ctx.t("reused"), hit.reused_tokens)
        m2.metric(ctx.t("computed"), hit.computed_tokens)
        m3.metric(ctx.t("first_difference"), "–" if closest is None else closest[1])
    if closest is None:
        st.caption(ctx.t("nothing_cached"))
        return
    cached = closest[0]
    cached_labels = [position_label(c) for c in ctx.runner.prompt_cells(cached)]
    with Part("alignment"):  # the new prompt aligned with the closest published one
        table(
            alignment_table(
                alignment_frame(cached, ctx.runner.prompt_ids, cached_labels, ctx.labels[:n], hit.reused_tokens),
                words(ctx),
            )
        )


def policies_side_by_side(ctx: ViewContext) -> dict:
    """The headline: what each policy reuses of this prompt, hit or miss, and per block or token. Returns the
    policies' results in the headline's order."""
    reuse = ctx.runner.policy_reuse()
    ordered = {policy: reuse[policy] for policy in HEADLINE_ORDER}
    st.markdown(ctx.t("policies_headline", size=ctx.state.block_size))
    for column, result in zip(st.columns(len(ordered)), ordered.values()):
        with column.container(key=f"verdict_{result.policy}"):
            verdict = "verdict_hit" if result.reused_tokens else "verdict_miss"
            st.metric(ctx.t("policy_" + result.policy), ctx.t(verdict))
            st.caption(
                ctx.t(
                    "policy_counts",
                    reused=result.reused_tokens,
                    computed=result.computed_tokens,
                    first=result.reused_tokens,
                )
            )
    figure(
        lambda: policies_figure(ordered, ctx.state.block_size, ctx.t("policies_fig"), ctx.large, words(ctx)),
        "prefix-policies",
        memo_key(
            ctx, "policies", *[(r.policy, r.computed_tokens, tuple(r.hits)) for r in ordered.values()], per_step=False
        ),
    )
    return ordered

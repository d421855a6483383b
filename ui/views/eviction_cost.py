"""What evicting cost the model's predictions: every policy's next-token KL from the full cache, the page's policy's
in words, and the full cache's answer read through both caches (`ui.runs.eviction_forced`), under the eviction view's
text."""

from __future__ import annotations

import math

import streamlit as st

from ui.runs.eviction_forced import ForcedReading
from ui.views.chapter_part import Part, shown
from ui.views.context import ViewContext
from ui.views.eviction_shown import EvictionShown
from ui.views.figures import figure, memo_key
from ui.views.widgets import opened, words
from viz.eviction import cost_figure


def cost(ctx: ViewContext, data: EvictionShown, policy: str) -> None:
    """Every policy's next-token KL from the full cache, answer token by answer token, and the page's policy's in
    words: what evicting cost the model's predictions."""
    if not shown("cost"):
        return
    with Part("cost"):
        name = lambda run: ctx.t("evict_short_" + run, window=data.settings.window)  # noqa: E731 — legend's short
        lines = {name(run): values for run, values in data.costs().items()}
        chosen = name(data.settings.run_name)
        figure(
            lambda: cost_figure(lines, chosen, ctx.t("evict_cost_title"), ctx.large, words(ctx)),
            "eviction-cost",
            memo_key(ctx, "cost", data.passes, len(lines)),
        )
        st.caption(cost_sentence(ctx, data, policy))
        if data.settings.at != "stream":  # the streaming window is its timing's one run
            st.caption(ctx.t("evict_cost_lab", count=len(lines), total=len(data.pair.lab.variants) - 1))
        forced(ctx, data, policy)


def forced(ctx: ViewContext, data: EvictionShown, policy: str) -> None:
    """The full cache's answer so far read through both caches (`ui.runs.eviction_forced`), while its expander is
    open."""
    with opened(ctx.t("evict_forced_open"), "x_forced") as box:
        if not box.open:
            return
        reading = ctx.runner.forced_reading(data.token_ids(data.pair.full), data.settings)
        with st.spinner(ctx.t("evict_forced_computing")):
            reading.compute()
        st.markdown(forced_sentence(ctx, reading, policy))


def forced_sentence(ctx: ViewContext, reading: ForcedReading, policy: str) -> str:
    full, evicting = round(float(reading.full.mean()), 3), round(float(reading.evicting.mean()), 3)  # as shown
    return ctx.t(
        "evict_forced_more" if evicting >= full else "evict_forced_less",
        n=len(reading.answer),
        policy=policy,
        evicting=f"{evicting:.3f}",
        full=f"{full:.3f}",
        delta=f"{abs(evicting - full):.3f}",
        ppl_evicting=f"{math.exp(evicting):.2f}",
        ppl_full=f"{math.exp(full):.2f}",
    )


def cost_sentence(ctx: ViewContext, data: EvictionShown, policy: str) -> str:
    token, kl, same = data.cost()
    if token < data.passes:  # the texts parted at an earlier token
        return ctx.t("evict_cost_parted", policy=policy, token=token, kl=f"{kl:.3g}")
    return ctx.t(
        "evict_cost_now",
        token=token,
        policy=policy,
        kl=f"{kl:.3g}",
        top=ctx.t("evict_cost_top_same" if same else "evict_cost_top_differs"),
    )

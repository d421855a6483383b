"""StreamingLLM's experiment in the eviction view: a text read through a small cache with and without attention
sinks (`ui.runs.sink_experiment`), its loss by position and by the number of sinks, and the sentence quoting them."""

from __future__ import annotations

import streamlit as st

from ui.runs.sink_experiment import CACHE, SINKS, SinkExperiment
from ui.views.chapter_part import shown
from ui.views.context import ViewContext
from ui.views.figures import figure, memo_key
from ui.views.widgets import opened, words
from viz.eviction import nll_by_position_figure, sinks_figure

SMOOTH = 32  # positions each point of the NLL-by-position lines averages


def streaming(ctx: ViewContext) -> None:
    """StreamingLLM's experiment on the loaded model (`ui.runs.sink_experiment`), in an expander built only while open:
    it reads a text through ten caches, seconds of work the first time on a server."""
    if not shown():
        return
    with opened(ctx.t("evict_streaming_open", cache=CACHE), "x_streaming") as box:
        if not box.open:
            return
        experiment = ctx.runner.sink_experiment(ctx.state.lang)
        if not experiment.done:
            bar = st.progress(0.0)
            experiment.compute(
                lambda done, total: bar.progress(
                    done / total, text=ctx.t("evict_streaming_computing", done=done, total=total)
                )
            )
            bar.empty()
        draw_streaming(ctx, experiment)


def draw_streaming(ctx: ViewContext, experiment: SinkExperiment) -> None:
    rest = CACHE - 4
    lines = {
        ctx.t("evict_line_full"): experiment.full,
        ctx.t("evict_line_alone", cache=CACHE): experiment.of(0),
        ctx.t("evict_line_sinks", rest=rest): experiment.of(4),
        ctx.t("evict_line_sinks_inside", rest=rest): experiment.of(4, inside=True),
    }
    figure(
        lambda: nll_by_position_figure(
            lines,
            CACHE,
            SMOOTH,
            ctx.t("evict_streaming_by_position_title", smooth=SMOOTH, cache=CACHE),
            ctx.large,
            words(ctx),
        ),
        "eviction-streaming",
        memo_key(ctx, "streaming", per_step=False),
    )
    mean = experiment.after_cache
    written = [mean(experiment.of(n)) for n in SINKS]
    inside = [mean(experiment.of(n, inside=True)) for n in SINKS]
    full = mean(experiment.full)
    figure(
        lambda: sinks_figure(
            SINKS, written, inside, full, ctx.t("evict_streaming_sinks_title", cache=CACHE), ctx.large, words(ctx)
        ),
        "eviction-sinks-count",
        memo_key(ctx, "sinks-count", per_step=False),
    )
    more = lambda nll: f"{mean(nll) - full:.2f}"  # noqa: E731 — nats a token over the full cache
    st.markdown(
        ctx.t(
            "evict_streaming_said",
            tokens=len(experiment.ids),
            cache=CACHE,
            full=f"{full:.2f}",
            alone=more(experiment.of(0)),
            one=more(experiment.of(1)),
            four=more(experiment.of(4)),
            four_inside=more(experiment.of(4, inside=True)),
        )
    )

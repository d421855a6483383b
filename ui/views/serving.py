"""Serving: many requests answered together from one paged pool (continuous batching, nano-vllm's scheduler). The
page's step is the server's: → runs one scheduler step (one forward pass for every request it picked), ← shows the
one before. The pool coloured by request (a shared block marked by how many read it), who prefilled, decoded, waited
or was preempted at each step, each request's answer growing, and tokens per second against the batch."""

from __future__ import annotations

import weakref
from statistics import median

import streamlit as st

from engine.errors import InvalidSettingError
from ui.runs.serving import PoolTooSmall, ServedClass
from ui.state.link import bounds
from ui.text.strings import Shown
from ui.views import class_questions
from ui.views.chapter_part import Part, shown
from ui.views.context import ViewContext
from ui.views.figures import figure, memo_key, shared_table
from ui.views.widgets import counter_line, words
from viz.serving import (
    decode_rates,
    pool_figure,
    request_names,
    requests_table,
    throughput_figure,
    timeline_figure,
    waited,
)

next_label = "next_step"  # → runs the server's next step


def advance_to(runner, state, step: int, served_round=None) -> int:
    """The page's step on this view: the server's steps run to `step` (or as far as its requests go), on the class's
    round or the samples (`Runner.serving`). Where the settings cannot serve, the step stays and the view says why."""
    try:
        return runner.serving(state, served_round).advance_to(step)
    except InvalidSettingError:
        return step


def at_end(runner, state, step: int, served_round=None) -> bool:
    """Whether → has nothing more to show: every request finished by `step` (or the settings cannot serve)."""
    try:
        served = runner.serving(state, served_round)
    except InvalidSettingError:
        return True
    return served.finished and step >= len(served.steps)


def details(ctx: ViewContext) -> None:
    """Nothing under the view: the requests' texts are in its table."""


def counter_html(ctx: ViewContext) -> str:
    """The header line on this view: the server's step, its kind and how many requests it ran."""
    try:
        served = ctx.served_class()
    except InvalidSettingError:
        served = None
    step = min(ctx.step, len(served.steps)) if served else 0
    if not step:
        text = ctx.t("serve_counter_ready")
    else:
        report = served.steps[step - 1].report
        text = ctx.t(
            "serve_counter_prefill" if report.prefill else "serve_counter_decode", step=step, n=len(report.ran)
        )
    return counter_line(text)


def render(ctx: ViewContext) -> None:
    st.subheader(ctx.t("serve_title"))
    main = Part("pool", key="main-figure")
    with main.under:
        controls(ctx)
    try:
        served = ctx.served_class()
    except PoolTooSmall as error:
        st.warning(ctx.t("serve_pool_too_small", needed=error.needed, blocks=error.blocks))
        return
    except InvalidSettingError as error:
        st.warning(ctx.t("bad_input", error=str(error)))
        return
    step = min(ctx.step, len(served.steps))
    memo = (weakref.ref(served), step)
    if main.shown:
        with main:
            pool(ctx, served, step, memo)
    if step:
        st.markdown(step_sentence(ctx, served, step))
    else:  # nothing has run: how to start, as every view says it
        st.info(step_sentence(ctx, served, step))
    class_questions.where_mine_is(ctx, served.steps[step - 1].report if step else None)
    if shown():
        st.caption(
            ctx.t(
                "serve_how",
                blocks=served.setup.num_blocks,
                size=served.setup.block_size,
                seqs=served.setup.max_num_seqs,
                budget=served.setup.max_num_batched_tokens,
            )
            + " "
            + exactness_note(ctx)
        )
    if shown("timeline"):
        with Part("timeline"):
            figure(
                lambda: timeline_figure(
                    [s.report for s in served.steps[:step]],
                    len(served.setup.prompts),
                    ctx.t("serve_timeline_title", step=step),
                    ctx.large,
                    words(ctx),
                ),
                "serving-steps",
                memo_key(ctx, "timeline", *memo),
            )
    if shown("requests"):
        with Part("requests"):
            requests(ctx, served, step, memo)
    if shown("throughput"):
        with Part("throughput"):
            throughput(ctx, served, step, memo)
    if shown():
        class_questions.room_part(ctx)


def controls(ctx: ViewContext) -> None:
    left, right = st.columns(2)
    left.number_input(
        ctx.t("serve_blocks"),
        *bounds("serve_blocks"),
        key=ctx.setting_key("serve_blocks"),
        step=1,
        help=ctx.t("serve_blocks_help"),
    )
    right.slider(
        ctx.t("serve_seqs"), *bounds("serve_seqs"), key=ctx.setting_key("serve_seqs"), help=ctx.t("serve_seqs_help")
    )


def pool(ctx: ViewContext, served: ServedClass, step: int, memo: tuple) -> None:
    setup = served.setup
    report = served.steps[step - 1].report if step else None
    used = len(report.owners) if report else 0
    figure(
        lambda: pool_figure(
            report,
            setup.num_blocks,
            setup.block_size,
            ctx.t("serve_pool_title", step=step, used=used, blocks=setup.num_blocks),
            ctx.large,
            words(ctx),
        ),
        "serving-pool",
        memo_key(ctx, "pool", *memo),
    )


def step_sentence(ctx: ViewContext, served: ServedClass, step: int) -> Shown:
    """What the shown step did, in words, every number read from its report."""
    if step == 0:
        due = sum(1 for a in served.setup.arrivals if a == 0)
        return ctx.t("serve_ready", n=due, total=len(served.setup.prompts))
    done = served.steps[step - 1]
    report = done.report
    ran = [rid for rid, _, _ in report.ran]
    if report.prefill:
        computed = sum(tokens for _, tokens, _ in report.ran)
        reused = sum(cached for _, _, cached in report.ran)
        text = ctx.t(
            "serve_did_prefill",
            step=step,
            n=len(ran),
            requests=request_names(ran),
            computed=computed,
            reused=reused,
            ms=done.seconds * 1000,
        )
    else:
        text = ctx.t("serve_did_decode", step=step, n=len(ran), requests=request_names(ran), ms=done.seconds * 1000)
    waiting = waited(report)  # as the timeline marks them
    if report.preempted:
        text += " " + ctx.t("serve_preempted_now", n=len(report.preempted), requests=request_names(report.preempted))
    if waiting:
        text += " " + ctx.t("serve_waiting_now", requests=request_names(waiting))
    finished = [s.id for s in report.requests if s.status == "finished"]
    if len(finished) == len(served.setup.prompts):
        text += " " + ctx.t("serve_all_done", n=len(finished))
    return Shown(text)


def exactness_note(ctx: ViewContext) -> str:
    """Whether a batch gives each request exactly its own tokens: in float32 (tests/test_server.py), not in a
    16-bit type, whose rounding depends on the batch's shape."""
    dtype = ctx.info.dtype
    return ctx.t("serve_exact_float32") if dtype == "float32" else ctx.t("serve_exact_bfloat16", dtype=dtype)


def requests(ctx: ViewContext, served: ServedClass, step: int, memo: tuple) -> None:
    st.markdown(f"**{ctx.t('serve_requests_title')}**")
    done = served.steps[step - 1] if step else None
    count = len(done.report.requests) if done else 0  # those that arrived by this step: the server holds them
    if not count:
        st.caption(ctx.t("serve_none_yet"))
        return
    frame = shared_table(
        lambda: requests_table(done.report, list(served.setup.questions), list(done.texts), count, words(ctx)),
        memo_key(ctx, "requests", *memo),
    )
    st.dataframe(frame, hide_index=True, key="serving-requests")


def throughput(ctx: ViewContext, served: ServedClass, step: int, memo: tuple) -> None:
    steps = served.steps[:step]
    rates = decode_rates([s.report for s in steps], [s.seconds for s in steps])
    if not rates:
        st.caption(ctx.t("serve_no_decode_yet"))
        return
    figure(
        lambda: throughput_figure(rates, ctx.t("serve_throughput_title"), ctx.large, words(ctx)),
        "serving-throughput",
        memo_key(ctx, "throughput", *memo),
    )
    st.caption(throughput_note(ctx, rates))


def throughput_note(ctx: ViewContext, rates: dict[int, list[float]]) -> str:
    """The fewest and most requests a decode step ran, their median tokens per second, and whether more was faster."""
    few, many = min(rates), max(rates)
    few_rate, many_rate = median(rates[few]), median(rates[many])
    if few == many:
        return ctx.t("serve_throughput_single_batch", many=many, many_rate=many_rate)
    return ctx.t(
        "serve_throughput_faster" if many_rate > few_rate else "serve_throughput_not_faster",
        few=few,
        few_rate=few_rate,
        many=many,
        many_rate=many_rate,
        per_request=many_rate / many,
    )

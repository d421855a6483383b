"""Several tokens per pass (speculative decoding, `engine.speculative`). The page's step is the run's verify pass:
→ runs one (a draft guesses, the model checks every guess in one pass), ← shows the one before. The guesses kept,
the first miss and the model's token that replaced it; the cache's rows the pass wrote, kept and discarded; tokens
per pass and bytes read per token against plain decoding; plain decoding and each draft timed on this machine."""

from __future__ import annotations

import weakref

import streamlit as st

from engine.drafts import DRAFTS
from engine.errors import KvscopeError
from ui.runs.speculative import SpeculativeRun
from ui.state.link import SPEC_PROMPTS, bounds
from ui.text.strings import Shown
from ui.views.chapter_part import Part, shown
from ui.views.context import ViewContext
from ui.views.figures import figure, memo_key, shared_table, table
from ui.views.widgets import counter_line, words
from viz.speculative import measured_table, pass_figure, passes_table, totals, totals_table

next_label = "next_pass"  # → runs the next verify pass


def advance_to(runner, state, step: int, room=None) -> int:
    """The page's step on this view: the run's passes made up to `step` (or to its end). Where the settings cannot
    run, the step stays and the view says why."""
    try:
        return runner.speculative(state).advance_to(step)
    except KvscopeError:
        return step


def at_end(runner, state, step: int, room=None) -> bool:
    """Whether → has nothing more to show: the answer ended by pass `step` (or the settings cannot run)."""
    try:
        run = runner.speculative(state)
    except KvscopeError:
        return True
    return run.finished and step >= len(run.passes)


def counter_html(ctx: ViewContext) -> str:
    """The header line on this view: the pass, and the tokens it and all passes so far made."""
    try:
        run = ctx.speculative()
    except KvscopeError:
        run = None
    step = min(ctx.step, len(run.passes)) if run else 0
    if not step:
        text = ctx.t("spec_counter_ready")
    else:
        text = ctx.t(
            "spec_counter",
            step=step,
            n=len(run.passes[step - 1].added),
            tokens=sum(len(p.added) for p in run.passes[:step]),
        )
    return counter_line(text)


def render(ctx: ViewContext) -> None:
    st.subheader(ctx.t("spec_title"))
    main = Part("pass", key="main-figure")
    with main.under:
        controls(ctx)
    try:
        run = ctx.speculative()
    except KvscopeError as error:
        st.warning(ctx.t("bad_input", error=str(error)))
        return
    step = min(ctx.step, len(run.passes))
    if not step:
        st.info(ctx.t("spec_ready", k=run.setup.k, prompt=len(run.setup.prompt_ids)))
        return
    done = run.passes[step - 1]
    if main.shown:
        with main:
            figure(
                lambda: pass_figure(
                    done,
                    ctx.token_text,
                    run.generation.table.pool.block_size,
                    ctx.t("spec_pass_title", step=step, rows=done.rows_written, kept=done.kept_rows),
                    ctx.large,
                    words(ctx),
                ),
                "speculative-pass",
                memo_key(ctx, "pass", weakref.ref(run), step),
            )
    st.markdown(pass_sentence(ctx, run, step))
    if shown("totals"):
        with Part("totals"):
            totals_part(ctx, run, step)
    if shown("measured"):
        with Part("measured"):
            measured_part(ctx, run)


def controls(ctx: ViewContext) -> None:
    left, middle, right = st.columns([1.2, 1, 1])
    left.radio(
        ctx.t("spec_prompt"),
        SPEC_PROMPTS,
        key=ctx.setting_key("spec_prompt"),
        format_func=lambda p: ctx.t(f"spec_prompt_{p}"),
        help=ctx.t("spec_prompt_help"),
    )
    middle.selectbox(
        ctx.t("spec_draft"),
        DRAFTS,
        key=ctx.setting_key("draft"),
        format_func=lambda d: ctx.t(f"fig_spec_draft_{d}"),
        help=ctx.t("spec_draft_help"),
    )
    right.slider(ctx.t("spec_k"), *bounds("draft_k"), key=ctx.setting_key("draft_k"), help=ctx.t("spec_k_help"))
    if ctx.state.draft == "early_exit":
        right.number_input(
            ctx.t("spec_n"),
            1,
            max(1, ctx.info.layers - 1),
            key=ctx.setting_key("draft_n"),
            step=1,
            help=ctx.t("spec_n_help", layers=ctx.info.layers),
        )


def pass_sentence(ctx: ViewContext, run: SpeculativeRun, step: int) -> Shown:
    """What pass `step` did, every number read from its record."""
    done = run.passes[step - 1]
    fed = len(done.fed) - len(done.guesses)
    key = "spec_did_prefill" if done.index == 0 else "spec_did_pass"
    text = ctx.t(key, step=step, fed=fed, n=len(done.guesses), rows=done.rows_written)
    if not done.guesses:
        text += " " + ctx.t("spec_no_guesses", token=ctx.token_text(done.token_id))
    elif done.accepted == len(done.guesses):
        text += " " + ctx.t("spec_all_kept", n=done.accepted, token=ctx.token_text(done.token_id))
    else:
        text += " " + ctx.t(
            "spec_miss",
            n=done.accepted,
            at=done.accepted + 1,
            guess=ctx.token_text(done.guesses[done.accepted]),
            token=ctx.token_text(done.token_id),
        )
    text += " " + ctx.t(
        "spec_added", n=len(done.added), discarded=done.rows_discarded, blocks=len(done.blocks_returned)
    )
    if done.stop_reason:
        text += " " + ctx.t("spec_ended", reason=done.stop_reason)
    return Shown(text)


def details(ctx: ViewContext) -> None:
    """Under the view (in the lesson, above the whole view): the answer after the pass, as plain text (container
    `generated`, as the other views' text so far)."""
    try:
        run = ctx.speculative()
    except KvscopeError:
        return
    _, text = run.answer_after(min(ctx.step, len(run.passes)))
    with st.container(key="generated"):
        st.markdown(f"**{ctx.t('spec_answer')}**")
        st.code("\n" + text + "\n", language=None, wrap_lines=True)  # st.code drops one newline at each end


def totals_part(ctx: ViewContext, run: SpeculativeRun, step: int) -> None:
    """Tokens per pass and bytes read per token so far, against plain decoding; then every pass in a row."""
    done = totals(run.passes[:step], ctx.info)
    st.markdown(f"**{ctx.t('spec_totals_title', tokens=done.tokens, passes=done.passes)}**")
    table(
        shared_table(lambda: totals_table(done, words(ctx)), memo_key(ctx, "totals", weakref.ref(run), step)),
        key="speculative-totals",
    )
    st.caption(ctx.t("spec_bytes_help"))
    frame = shared_table(
        lambda: passes_table(run.passes[:step], ctx.token_text, words(ctx)),
        memo_key(ctx, "passes", weakref.ref(run), step),
    )
    table(frame, key="speculative-passes")


def measured_part(ctx: ViewContext, run: SpeculativeRun) -> None:
    st.markdown(f"**{ctx.t('spec_measured_title')}**")
    measured = run.measured
    if measured is None:
        if st.button(ctx.t("spec_measure"), key=ctx.own_key("spec_measure"), help=ctx.t("spec_measure_help")):
            with st.spinner(ctx.t("spec_measuring")):
                measured = run.measure()
    if measured is None:
        return
    frame = shared_table(lambda: measured_table(measured.rows, words(ctx)), ("speculative-timed", weakref.ref(run)))
    table(frame, key="speculative-measured")
    plain = measured.of("none")
    best = min(measured.rows[1:], key=lambda r: r.ms_per_token)
    st.caption(
        ctx.t(
            "spec_measured_note",
            plain=plain.ms_per_token,
            draft=ctx.t(f"fig_spec_draft_{best.draft}"),
            best=best.ms_per_token,
            ratio=plain.ms_per_token / best.ms_per_token,
        )
    )

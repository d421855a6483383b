"""The step's fragment: the step buttons, Play, the token stream, the chosen view and, in the lesson, the chapter's
header, figure and text. A press, a view or head change and Play's ticks redraw it alone, never the sidebar. Where
its parts go: `ui.page.step_layout`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import streamlit as st

import engine
from ui import views
from ui.follow import ask_round, follower, serving_room
from ui.follow import page as follow
from ui.lesson import panel as lesson
from ui.lesson.chapters import CHAPTERS
from ui.page.page_state import (
    current_state,
    labels,
    load_case,
    measure_again,
    open_on_focused_head,
    page_lock,
    request_whole_page,
    show_problem,
    t,
    undo_stale_echoes,
    write_link,
)
from ui.page.step_layout import fresh_place, layout_side, step_places
from ui.runs import turns
from ui.runs.runner import Runner
from ui.state.link import clamp
from ui.state.session import PlayClock, lesson_session, page_controls, page_session, settings
from ui.views import VIEWS, stepper
from ui.views import ask as ask_part
from ui.views.chapter_part import CHAPTER_FIGURE, ChapterFigure
from ui.views.context import ViewContext
from ui.views.paint import TEXT_SENT
from ui.views.widgets import HEAD_VIEWS, ProgressNotice, opened

log = logging.getLogger("kvscope")
clock = time.monotonic  # the page's clock: Play's ticks (tests set their own)
CHAPTER_FIGURE_HEIGHT = {False: 480, True: 440}  # px: what the first screen has below the lesson's header


def stepper_and_view(model: engine.Model, runner: Runner) -> None:
    """The step, its view and (in the lesson) its chapter: a fragment, redrawn alone by a press of a step button,
    a change of view, layer or head, and Play's ticks. A fault stays in this session: it is shown, and the
    session can start again; the shared model and other sessions are untouched."""
    if not page_session().take("echoes_undone"):  # a run of the step alone (a tick, a press, a push): its request's
        undo_stale_echoes()  # before the follower's check reads the settings; the sidebar's widgets are not drawn
    follower.take_step()  # a follower: the leader's new step (a run of this fragment alone follows the leader's move)
    follower.check(current_state())  # a follower who moved on their own is told at once, above the fragment
    page, lesson_state = page_session(), lesson_session()
    if page.whole_page_due or lesson_state.pending_case:  # an article's case is loaded before any widget
        page.whole_page_due = False
        st.rerun(scope="app")  # a control in here changed what the rest of the page shows
    try:
        with page_lock():  # a fragment's rerun does not pass through main
            # a chapter entered in this fragment: its run, from an empty cache
            if lesson_state.take("forget_published"):
                runner.forget_published()
                runner.configure(runner.config)
            role = turns.LEADER if follow.leading() else turns.FOLLOWER if follow.following() else turns.EXPLORER
            told = []  # a page is told while others go first; the notice goes once its turn comes

            def waiting(class_first: bool) -> None:
                told.append(st.empty())
                told[0].caption(t("waiting_for_class" if class_first else "waiting_for_pages"))

            with turns.turn(role, waiting):
                for notice in told:
                    notice.empty()
                draw_step(model, runner)
        return
    except engine.KvscopeError as error:
        message = t("bad_input", error=str(error))
    except Exception as error:  # noqa: BLE001 — Streamlit's own control flow is BaseException, not caught
        log.error("a step failed: %s", type(error).__name__, exc_info=True)  # no prompt text in the log
        message = t("step_failed", error=f"{type(error).__name__}: {error}")
    st.error(message)
    st.button(t("reset_session"), key="b_reset_session", on_click=reset_session)


def reset_session() -> None:
    """Drop this browser session's run (its K/V blocks go back); the settings and link stay."""
    page = page_session()
    runner, page.runner = page.runner, None
    if runner is not None:
        try:
            runner.close()
        except Exception:  # noqa: BLE001 — the run is being discarded anyway
            log.warning("closing a failed run raised", exc_info=True)
    page.step = 0
    request_whole_page()  # the page builds the session's new run


def draw_step(model: engine.Model, runner: Runner) -> None:
    """The step counter, the step buttons and Play in one row, the token stream, then the chosen view (its main
    figure first) and the step's text and candidates: at 1280×720 the main figure starts on the first screen.
    In the lesson: the chapter's header, then its figure beside the step's controls and the chapter's text, the
    text so far, and the whole view under them, closed: a chapter change draws the chapter's figure, not five."""
    chapter = CHAPTERS[settings.chapter - 1] if settings.get("chapter") else None
    page = page_session()
    side = layout_side()
    places = step_places(chapter, side)
    step_buttons(places.buttons, runner, busy=True)
    places.play.toggle(
        t("play"), key=page_controls.key("playing"), on_change=request_whole_page
    )  # Play sets the fragment's timer
    if page_controls.get("playing"):
        if at_end(runner):
            page.stop_playing = True
            st.rerun(scope="app")
        page.step = play_step(page.step, page_controls.pace)
    else:
        page.play_clock = None  # a Play started later starts its own clock
    requested = page.step
    state, problems = clamp(current_state(), model.info.layers, model.info.q_heads)  # before a view's run reads them
    for problem in problems:
        settings[problem.param] = getattr(state, problem.param)
    own = own_steps()  # the Serving and speculative views step a run of their own: a server's step, a verify pass
    catching_up = ProgressNotice(places.controls, lambda done: t("catching_up", done=done, step=requested))
    room = serving_room.room_for(state) if state.view == "serving" else None
    page.step = (
        own.advance_to(runner, state, requested, room.served if room else None)
        if own
        else runner.advance_to(requested, catching_up)
    )
    catching_up.clear()
    state = ask_round.at_step(replace(state, step=page.step), page.step)
    trace = None if own else runner.trace(page.step)
    if state.view in HEAD_VIEWS or chapter is not None and trace is not None and trace.split is not None:
        state = open_on_focused_head(state, trace)  # its pickers, or the chapter's split text, show a layer and head
    ctx = ViewContext(
        runner=runner,
        state=state,
        step=page.step,
        trace=trace,
        stage=chapter.stage if chapter else None,
        measured_again=page.measured_again,
        room=room,
        load_case=load_case,
        measure_again=measure_again,
    )
    if follow.leading() or follow.follows_a_room():  # the class's round: a prediction of the next token, or a vote
        question = lesson.question(ctx) if chapter is not None else None
        ctx.ask = ask = ask_round.round_for(state, page.step, runner, question, predicts=not own)
    else:
        ask = None
    with places.controls:
        if page.step < requested and not own:  # its run's end: the view's own sentence says so
            st.warning(t("step_unreachable", step=requested, reached=page.step, reason=runner.stop_reason))
        for problem in problems:
            show_problem(problem)
        page.counter_html = own.counter_html(ctx) if own else stepper.counter_html(ctx)
        places.counter.html(page.counter_html)
        revealed = ask is not None and ask.number and ask.phase == "shown"
        ask_beside = chapter is not None and follow.leading() and not revealed
        ask_part.part(ctx, here=not ask_beside)  # a phone's box under its step buttons; a reveal the screen's width
    with places.beside:
        if not own:  # the view's run has its own tokens and texts
            stepper.render(ctx, lines=1 if chapter else None)
        if chapter is not None:
            if follow.leading():  # beside the chapter's figure: the projector's first screen keeps the figure
                ask_part.part(ctx, here=ask_beside)
            lesson.panel(ctx)
    st.radio(
        t("view"),
        VIEWS,
        key=settings.key("view"),
        horizontal=True,
        format_func=labels("view_"),
        label_visibility="collapsed",
    )  # hidden in the lesson: the chapter sets the view
    if chapter is None:
        view_place, details_place = fresh_place(st, side), st.container()
        placed = CHAPTER_FIGURE.set(None)
    else:  # under the chapter, the text so far, then the view's other parts: built only while opened
        details_place = st.container()
        whole = opened(t("lesson_whole_view"), "x_whole_view")
        view_place = fresh_place(whole, side)
        placed = CHAPTER_FIGURE.set(
            ChapterFigure(chapter.figure, *places.chapter_figure, CHAPTER_FIGURE_HEIGHT[ctx.large], whole.open)
        )
    sent = None
    try:
        with details_place:  # sent before the view's figures: the step's text is on screen first
            (own or stepper).details(ctx)
        sent = TEXT_SENT.set(time.perf_counter())
        with view_place:
            views.render(settings.view, ctx)
    finally:
        CHAPTER_FIGURE.reset(placed)
        if sent is not None:
            TEXT_SENT.reset(sent)
    step_buttons(places.buttons, runner)  # live again only once the screen shows this step, as the link does
    write_link(current_state())


def play_step(step: int, pace: float) -> int:
    """Play's next step: one more each tick, and more when ticks came late (a slow draw, a busy server), so that
    the tokens keep the pace's clock. A step or pace changed by hand starts the clock again."""
    page = page_session()
    now, playing = clock(), page.play_clock
    if playing is None or playing.pace != pace or playing.last != step:
        playing = PlayClock(now, step, pace, step)
    nxt = max(step + 1, playing.step + 1 + int((now - playing.start) / pace + 1e-9))  # + rounding of floats
    page.play_clock = replace(playing, last=nxt)
    return nxt


def step_buttons(place, runner: Runner, busy: bool = False) -> None:
    """Prefill, Back, Next, Reset, drawn in `place`. While a step is computed and drawn (`busy`) they are
    greyed and their arrow keys unbound: Streamlit would merge or drop presses made during a run, so they
    are refused visibly instead. Back and Next move by one from the step current when a press is handled."""
    page = page_session()
    own = own_steps()
    next_label = own.next_label if own else "next"  # there a step is the view's run's
    buttons = (
        ("prefill", "b_prefill", (1, True), {"disabled": page.step >= 1}),
        ("back", "b_back", (-1, False), {"shortcut": "Left", "disabled": page.step == 0}),
        (next_label, "b_next", (1, False), {"shortcut": "Right", "disabled": not busy and at_end(runner)}),
        ("reset", "b_reset", (0, True), {}),
    )
    # One row that never wraps (a phone keeps it): one element, where columns were five (each is a message to
    # every page of a class, twice a step). Next is the widest (page CSS), being pressed most.
    row = place.container(horizontal=True, wrap=False, key="step-buttons-busy" if busy else "step-buttons")
    moved = page.moved and not busy
    if not busy:  # the live buttons are this step's: a new press may move
        page.moved = False
    for label, key, move_args, options in buttons:
        if busy:
            row.button(t(label), key=key + "_busy", disabled=True, width="stretch")
            continue
        pressed = row.button(t(label), key=key, on_click=move, args=move_args, width="stretch", **options)
        if pressed and not moved:
            # No callback ran: a restarted server rebuilt this session from its link in this very run, and the
            # server that drew the button (and knew its callback) is gone. The press still counts.
            move(*move_args)
            st.rerun()


def at_end(runner: Runner) -> bool:
    """Whether Next has nothing more to show: the run ended at this step (on the Serving view, every request)."""
    step, own = page_session().step, own_steps()
    if own:
        state = current_state()
        return own.at_end(runner, state, step, serving_room.served_round(state) if state.view == "serving" else None)
    return runner.finished and step >= runner.generated


def own_steps():
    """The view module whose run the page's step counts (`ui.views.OWN_STEPS`), or None: the page's run's tokens."""
    return views.own_steps(settings.get("view"))


def move(amount: int, absolute: bool) -> None:
    """A step button's press: go to step `amount`, or by `amount` from the current step. A press moves once:
    Streamlit can call a button's callback a second time for one press, when the run the first call started is
    stopped before it draws the step buttons again (Next then moved two steps: 2 presses in ~450 on a busy machine,
    the two calls 55 ms apart in the server's log). A press moved and not yet drawn (`moved`, cleared when the
    live step buttons are drawn) is that second call."""
    with page_lock():  # callbacks run before main, maybe while a stopped run is still stepping
        page = page_session()
        if page.moved:
            return
        page.step = max(0, amount if absolute else page.step + amount)
        page.moved = True

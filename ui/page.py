"""The Streamlit page: widgets and layout. The numbers come from `ui.runner` (the engine), figures from `viz`."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, fields, replace

import streamlit as st
import torch

import engine
from engine import timing
from ui import cases, follow, memory, model_card, strings
from ui.context import ViewContext
from ui.lesson import CHAPTERS
from ui.runner import ClassroomCache, Runner, RunConfig, RunStore
from ui.settings import DTYPES, Limits, StepLimits, fit_state, load_limits, step_limits
from ui.state import (LANGS, POLICIES, VIEWS, AppState, Problem, bounds, clamp, clean_prompt, default_prompt,
                      language_defaults, parse_query, to_query)
from ui.views import attention, costs, flow, kv_cache, lesson, prefix, split_kv, stepper
from ui.views.common import CHAPTER_FIGURE, ChapterFigure

VIEW_MODULES = {"flow": flow, "attention": attention, "kv": kv_cache, "split": split_kv, "prefix": prefix,
                "costs": costs}
ss = st.session_state
log = logging.getLogger("kvscope")
clock = time.monotonic  # Play's clock (tests set their own)


@st.cache_resource(show_spinner=False, max_entries=3)
def read_model(spec: str) -> engine.Model:
    """Config, tokenizer and weights (the embedded model's are converted on the server's first start), in the
    host's dtype (KVSCOPE_DTYPE: fixed for the process, so the model's spec alone names the cached copy)."""
    return engine.load_model(spec, dtype=getattr(torch, load_limits().dtype))


@st.cache_resource(show_spinner=False, max_entries=3)
def load_model(spec: str) -> engine.Model:
    """One copy per model for the whole server, shared read-only by every session."""
    model = timing.warm_up(read_model(spec))  # timed steps are then steady-state, not cold
    memory.freeze_long_lived()  # the collector after each script run then skips the model's objects
    return model


LOADED: set[str] = set()  # models this process has loaded: the page shows the loading stages only before
# Streamlit's own chrome a student could take for the app's: the "Running…" man and its Stop button (a step
# shows its own progress: the step buttons grey while it runs). Deploy and the menu go by toolbarMode.
CHROME_CSS = '<style>[data-testid="stStatusWidget"] { visibility: hidden; }</style>'

# The projector's first screen (1280×720) holds the header, the step buttons and the view's main figure: less
# padding above and beside the page, tighter gaps, a one-line title, smaller view headings.
LAYOUT_CSS = """<style>
[data-testid="stMainBlockContainer"] { padding: 2.5rem 2rem 3rem 2rem; }
@media (max-width: 640px) {  /* a phone: the header holds the sidebar's button, the title goes below it */
  [data-testid="stMainBlockContainer"] { padding: 4rem 1rem 3rem 1rem; }
  /* the four step buttons stay one row (Streamlit stacks columns on a phone): the step's figure reaches the screen */
  [data-testid="stHorizontalBlock"]:has(> [data-testid="stColumn"] > [data-testid="stVerticalBlock"] > [class*="st-key-b_next"]) {
    flex-wrap: nowrap; gap: 0.25rem; }
  [data-testid="stHorizontalBlock"]:has(> [data-testid="stColumn"] > [data-testid="stVerticalBlock"] > [class*="st-key-b_next"]) > [data-testid="stColumn"] {
    min-width: 0 !important; width: auto !important; flex: 1 1 0 !important; }
  [data-testid="stMain"] button kbd { display: none; }  /* a phone has no arrow keys: the label gets the room */
  [data-testid="stMain"] button { padding-left: 0.35rem; padding-right: 0.35rem; }
}
[data-testid="stMain"] [data-testid="stVerticalBlock"] { gap: 0.5rem; }
[data-testid="stMain"] h1 { font-size: 1.3rem; padding: 0; line-height: 1.3; }
[data-testid="stMain"] h3 { font-size: 1.15rem; padding-top: 0.25rem; }
</style>"""
LARGE_CSS = "<style>html { font-size: 125%; }</style>"  # every rem-sized text and control, a quarter larger
# In the lesson the chapter sets the view (its selector is hidden) and its title is the page's: a compact header.
LESSON_CSS = """<style>
.st-key-w_view { display: none; }
[data-testid="stMainBlockContainer"] { padding-top: 3.9rem; }  /* the title clears Streamlit's header bar (3.75rem) */
</style>"""
CHAPTER_FIGURE_HEIGHT = {False: 480, True: 440}  # px: what the first screen has below the lesson's header


def t(key: str, **values) -> str:
    """A string in today's language; the values (link values, prompts, model ids, errors) show as text."""
    return strings.t(key, ss.get("w_lang", "en"), **values)


def labels(prefix: str):
    """A format_func for options whose labels are strings `prefix + option`, in today's language."""
    lang = ss.get("w_lang", "en")
    return lambda option: strings.t(prefix + option, lang)


def main() -> None:
    with run_lock():
        draw_page()


def run_lock() -> threading.RLock:
    """One script run at a time in a browser session. Each press starts a new run and Streamlit stops the old
    one only at its next Streamlit call, so without this a run could still be inside the engine while the
    next one moves the step or reconfigures the same run."""
    return ss.setdefault("run_lock", threading.RLock())


def draw_page() -> None:
    """The whole page: settings, banners, then the step and its view in a fragment (`stepper_and_view`), which a
    step press, a view or layer change, and Play's ticks redraw alone."""
    limits = load_limits()
    if "initialized" not in ss:
        start_from_link(limits)
    # The lesson needs the whole projector's width: its chapters are in the sidebar, closed until asked for.
    st.set_page_config(page_title="kvscope", page_icon="🔎", layout="wide",
                       initial_sidebar_state="collapsed" if ss.get("w_chapter") else "auto")
    st.html(CHROME_CSS)
    memory.tune_allocator()
    restore_lost_settings()
    follow.take_over(lambda query: follow_leader(query, limits))  # before any widget, as the link is
    if ss.pop("stop_playing", False):
        ss.w_playing = False
    ss.pop("full_rerun", None)  # this run is one
    model, failure = model_for(ss.w_model)
    runner = runner_for(model, limits) if model is not None else None
    if runner is not None:
        if ss.pop("forget_published", False):
            runner.forget_published()
        apply_pending_case(runner, limits)  # before the widgets: it sets the prompt and chat switch
        if ss.w_chat and not runner.can_chat:  # a base model: its prompt goes in as it is
            ss.w_chat = False
            ss.problems = ss.get("problems", []) + [Problem("chat", "1", "0", "no_chat_template")]
        fit_to_budget(step_limits(limits, model.info))
    in_lesson = bool(ss.get("w_chapter"))
    st.html(LAYOUT_CSS + (LARGE_CSS if ss.w_large else "") + (LESSON_CSS if in_lesson else ""))
    if not in_lesson:  # a lesson's header is its chapter's title
        st.title(t("title"))
    follow.show(t)
    for problem in ss.pop("problems", []):
        show_problem(problem)
    if limits.bad_dtype:
        st.warning(t("dtype_bad", value=limits.bad_dtype, allowed=" / ".join(DTYPES)))
    sidebar(limits, can_think=runner is not None and runner.can_think, can_chat=runner is None or runner.can_chat)  # after the banner: it reaches the screen first
    if model is None:
        st.error(failure)
        st.button(t("use_default"), key="use_default", on_click=use_default_model)
        return
    state = current_state()
    prompt, reasons = clean_prompt(state.prompt)
    for reason in reasons:
        st.warning(t("prompt_cleaned", reason=t("reason_" + reason)))
    try:
        runner.configure(run_config(replace(state, prompt=prompt), limits))
    except engine.KvscopeError as error:
        st.error(t("bad_input", error=str(error)))
        write_link(state)
        return
    play_controls(limits)
    pace = ss.w_pace if ss.get("w_playing") else None
    st.fragment(run_every=pace)(stepper_and_view)(model, runner)
    model_card.render(model.info, t)  # at the foot, collapsed: the first screen is the step's
    st.caption(t("tagline"))  # at the foot: the first screen is for the step and its figure


def request_full_run() -> None:
    """A control inside the step's fragment changed what the rest of the page shows (the chapter and its
    settings, Play, an article's case): the fragment's next run hands over to a run of the whole page."""
    ss.full_rerun = True


# -- state ------------------------------------------------------------------------------------


def start_from_link(limits: Limits) -> None:
    apply_link(st.query_params.to_dict(), limits)
    ss.initialized = True


def follow_leader(query: dict[str, str], limits: Limits) -> None:
    """A follower takes the leader's state (`query`: the leader's link), keeping its own language and text size."""
    apply_link(query, limits, mine=follow.OWN)
    ss.stop_playing = True  # the leader's steps drive this page now


def apply_link(params: dict[str, str], limits: Limits, mine: frozenset[str] = frozenset()) -> None:
    """Put the page in the state a link's `params` describe, except the settings named in `mine`, which stay.
    A chapter is entered only when it changes (its case runs once)."""
    state, problems = parse_query(params)
    if not limits.model_allowed(state.model):
        problems.append(Problem("model", state.model[:80], "embedded", "model_not_allowed"))
        state = replace(state, model="embedded")
    chapter_before = ss.get("w_chapter")
    for f in fields(AppState):
        if f.name != "step" and f.name not in mine:
            ss["w_" + f.name] = getattr(state, f.name)
    ss.step = state.step
    ss.problems = ss.get("problems", []) + problems
    if state.chapter and state.chapter != chapter_before:
        enter_chapter(state.chapter, keep=frozenset(params))  # the link's own values stay


def go_to_chapter(number: int) -> None:
    """A lesson control's press: chapter `number` (0 leaves the lesson, keeping the page as it is). The chapter
    sets the sidebar's settings too, so the whole page is drawn again."""
    with run_lock():
        enter_chapter(number)
        request_full_run()


def enter_chapter(number: int, keep: frozenset[str] = frozenset()) -> None:
    """Put the page in chapter `number`'s state: its view, step, block size and split count, and the article's
    case where it has one. Settings named in `keep` stay as they are; the prompt and sampling are the class's."""
    ss.w_chapter = number
    if not number:
        return
    chapter = CHAPTERS[number - 1]
    for name, value in {"view": chapter.view, "step": chapter.step, **chapter.settings}.items():
        if name not in keep:
            ss[name if name == "step" else "w_" + name] = value
    if chapter.case:
        ss.pending_case = chapter.case
    else:  # a chapter's run starts from an empty prefix cache: the same run on every visit, for every page
        ss.forget_published = True
        if ss.w_prompt in cases.CASE_PROMPTS and "prompt" not in keep:  # back from a case: the usual prompt
            ss.w_prompt, ss.w_chat = default_prompt(ss.w_lang), True
    if chapter.view == "attention":
        ss.focused_head_chosen = False  # open on a head with a pattern worth talking about


def current_state() -> AppState:
    values = {f.name: ss["w_" + f.name] for f in fields(AppState) if f.name != "step" and "w_" + f.name in ss}
    return AppState(step=ss.step, **values)


def restore_lost_settings() -> None:
    """Put back any setting whose widget state Streamlit dropped (the last state drawn is kept under a key no
    widget owns): a text area that lost its state would come back empty, and the page would refuse to run. Seen
    once under a class's load, as a page whose link turned to `prompt=` with nobody typing."""
    for name, value in ss.get("drawn_state", {}).items():
        if "w_" + name not in ss:
            log.warning("setting %s was lost by its widget and restored", name)  # the name only, never the value
            ss["w_" + name] = value
    if "w_policy" in ss and ss["w_policy"] not in POLICIES:  # its labels change with the language: the browser
        # sent back the old label of the option it showed, which is no option now
        ss["w_policy"] = ss.get("drawn_state", {}).get("policy", AppState.policy)


def write_link(state: AppState) -> None:
    ss.drawn_state = {f.name: getattr(state, f.name) for f in fields(AppState) if f.name != "step"}
    follow.publish(state)  # a leader's every draw (a play tick too) reaches its followers
    follow.check(state)  # a follower's own move (Play's tick too) leaves following
    query = to_query(state) | follow.link_params()
    if st.query_params.to_dict() != query:
        st.query_params.from_dict(query)


def run_config(state: AppState, limits: Limits) -> RunConfig:
    return RunConfig(
        prompt=state.prompt, chat=state.chat, think=state.think,
        sampling=engine.Sampling(temperature=float(state.temperature), top_k=int(state.top_k),
                                 top_p=float(state.top_p), seed=int(state.seed)),
        block_size=int(state.block_size), kv_splits=int(state.kv_splits), policy=state.policy,
        max_new_tokens=limits.max_new_tokens, max_prompt_tokens=limits.max_prompt_tokens,
    )


def model_for(spec: str) -> tuple[engine.Model | None, str]:
    """The shared model, or None and a message saying why it could not be loaded."""
    try:
        return (load_model(spec) if spec in LOADED else load_with_stages(spec)), ""
    except (engine.KvscopeError, OSError, MemoryError) as error:
        return None, t("model_failed", model=spec, error=str(error) or type(error).__name__)
    except Exception as error:  # noqa: BLE001 — any loading fault is shown, never a traceback
        log.error("loading a model failed: %s", type(error).__name__, exc_info=True)
        return None, t("model_failed", model=spec, error=f"{type(error).__name__}: {error}")


def load_with_stages(spec: str) -> engine.Model:
    """Load a model this process has not loaded yet, saying what it is doing (17–49 s on a first start)."""
    place = st.empty()
    embedded_titles = {"embedded": "loading_embedded", "embedded-zh": "loading_embedded_zh"}  # no bare id in Chinese
    title = t(embedded_titles[spec]) if spec in embedded_titles else t("loading", model=spec)
    with place.container(), st.status(title, expanded=True):
        bar = st.progress(0.05, text=t("loading_read"))
        read_model(spec)
        bar.progress(0.8, text=t("loading_warm"))
        model = load_model(spec)
    place.empty()  # loaded: the page takes its place (a failure stays, with the error below it)
    LOADED.add(spec)
    return model


def switch_language() -> None:
    """A page switched language: what is still the old language's default (its model with its chat switch, its
    prompt) becomes the new one's, so a page switched to Chinese on the default model opens on the Chinese model.
    A follower's language is its own: the teacher's model and prompt stay."""
    if ss.get("follow_role") == "follow":
        return
    old = language_defaults(ss.get("drawn_state", {}).get("lang", AppState.lang))
    new = language_defaults(ss.w_lang)
    if ss.w_model == old.model:
        ss.w_model, ss.w_chat = new.model, new.chat
    if ss.w_prompt == old.prompt:
        ss.w_prompt = new.prompt


def use_default_model() -> None:
    ss.w_model = "embedded"


@st.cache_resource(show_spinner=False, max_entries=3)
def classroom_cache(spec: str, tokens: int, lease_seconds: int) -> ClassroomCache:
    """The class-wide prefix cache (only when the host turns it on): one per model for the server."""
    return ClassroomCache(load_model(spec), tokens, lease_seconds)


@st.cache_resource(show_spinner=False, max_entries=3)
def run_store(spec: str, max_bytes: int) -> RunStore:
    """The runs pages share, one store per model for the server."""
    return RunStore(max_bytes)


def runner_for(model: engine.Model, limits: Limits) -> Runner:
    """This browser session's view of a run: on the class's prefix cache when the host shares one, else a run
    shared with every page that has the same settings and prompt history."""
    runner = ss.get("runner")
    if runner is None or runner.model is not model:
        if runner is not None:
            runner.close()
        classroom = (classroom_cache(ss.w_model, limits.shared_cache_tokens, limits.lease_seconds)
                     if limits.shared_prefix_cache else None)
        runs = run_store(ss.w_model, limits.shared_runs_mb * 10**6)
        runner = ss.runner = Runner(model, limits.cache_tokens, limits.full_traces, classroom, runs)
    return runner


def apply_pending_case(runner: Runner, limits: Limits) -> None:
    """The article's cases: the cached prompt alone published (prefilled at the case's settings), then the edit."""
    which = ss.pop("pending_case", None)
    if which is None:
        return
    ss.w_chat = False
    ss.w_block_size = cases.CASE_BLOCK_SIZE  # small enough for the block policy's reuse to show
    ss.w_view = "prefix"
    runner.publish_alone(run_config(replace(current_state(), prompt=cases.CASE_CACHED), limits))
    ss.w_prompt = cases.CASES[which]


# -- widgets ----------------------------------------------------------------------------------


def sidebar(limits: Limits, can_think: bool = False, can_chat: bool = True) -> None:
    """The lesson's chapters (or the way into it), then the settings. can_think: the model's chat template has a
    thinking switch (Qwen3), so the Thinking toggle shows; can_chat: it has a chat template at all (a base model
    has none: the chat switch is off and greyed).

    Each setting's widget is given its current value as its default (`value=`, a selectbox's `index=`). Under a
    class's load a browser can draw a sidebar widget anew, without the value it held (seen in the 30-page load
    test: a page's prompt turned "", or chat, top-p and block size turned to off and their minimums, with nobody
    touching them); such a widget starts from its default and sends it back as a change. With the current value
    as the default, that change changes nothing."""
    with st.sidebar:
        lesson.sidebar(ss.get("w_chapter", 0), ss.w_lang, go_to_chapter)
        st.selectbox(t("language"), LANGS, key="w_lang", index=LANGS.index(ss.w_lang),
                     format_func=lambda code: strings.LANGUAGE_NAMES[code], on_change=switch_language)
        st.toggle(t("large_text"), key="w_large", value=ss.w_large)
        if limits.allow_any_model:
            st.text_input(t("model"), key="w_model", value=ss.w_model, help=t("model_help_any"))
        else:
            options = list(limits.models)
            if ss.w_model not in options:
                ss.w_model = "embedded"
            st.selectbox(t("model"), options, key="w_model", index=options.index(ss.w_model), help=t("model_help"))
        st.text_area(t("prompt"), key="w_prompt", value=ss.w_prompt, height=120, max_chars=4000)
        st.toggle(t("chat"), key="w_chat", value=ss.w_chat, help=t("chat_help" if can_chat else "chat_none_help"),
                  disabled=not can_chat)
        if can_think:
            st.toggle(t("think"), key="w_think", value=ss.w_think, help=t("think_help"), disabled=not ss.w_chat)
        st.markdown(f"**{t('sampling')}**")
        st.slider(t("temperature"), *bounds("temperature"), key="w_temperature", value=ss.w_temperature, step=0.05,
                  help=t("temperature_help"))
        st.number_input("top-k", *bounds("top_k"), key="w_top_k", value=ss.w_top_k, step=1, help=t("top_k_help"))
        st.slider("top-p", *bounds("top_p"), key="w_top_p", value=ss.w_top_p, step=0.01, help=t("top_p_help"))
        st.number_input(t("seed"), *bounds("seed"), key="w_seed", value=ss.w_seed, step=1)
        st.markdown(f"**{t('cache')}**")
        st.number_input(t("block_size"), *bounds("block_size"), key="w_block_size", value=ss.w_block_size, step=1,
                        help=t("block_size_help"))
        st.number_input(t("kv_splits"), *bounds("kv_splits"), key="w_kv_splits", value=ss.w_kv_splits, step=1,
                        help=t("kv_splits_help"))
        st.selectbox(t("policy"), POLICIES, key="w_policy", index=POLICIES.index(ss.w_policy),
                     format_func=labels("policy_"))


def play_controls(limits: Limits) -> None:
    """The pace, with the settings in the sidebar; the Play toggle sits in the step buttons' row (`draw_step`)."""
    ss.setdefault("w_pace", max(limits.min_pace, 0.8))
    st.sidebar.slider(t("pace"), limits.min_pace, 3.0, key="w_pace", value=ss.w_pace, step=0.1)  # value: see sidebar


def stepper_and_view(model: engine.Model, runner: Runner) -> None:
    """The step, its view and (in the lesson) its chapter: a fragment, redrawn alone by a press of a step button,
    a change of view, layer or head, and Play's ticks. A fault stays in this session: it is shown, and the
    session can start again; the shared model and other sessions are untouched."""
    follow.check(current_state())  # a follower who moved on their own is told at once, above the fragment
    if ss.pop("full_rerun", False) or "pending_case" in ss:  # an article's case is loaded before any widget
        st.rerun(scope="app")  # a control in here changed what the rest of the page shows
    try:
        with run_lock():  # a fragment's rerun does not pass through main
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
    runner = ss.pop("runner", None)
    if runner is not None:
        try:
            runner.close()
        except Exception:  # noqa: BLE001 — the run is being discarded anyway
            log.warning("closing a failed run raised", exc_info=True)
    ss.step = 0
    request_full_run()  # the page builds the session's new run


def draw_step(model: engine.Model, runner: Runner) -> None:
    """The step counter, the step buttons and Play in one row, the token stream, then the chosen view (its main
    figure first) and the step's text and candidates: at 1280×720 the main figure starts on the first screen.
    In the lesson: the chapter's header, then its figure beside the step's controls and the chapter's text."""
    chapter = CHAPTERS[ss.w_chapter - 1] if ss.get("w_chapter") else None
    places = step_places(chapter)
    step_buttons(places.buttons, runner, busy=True)
    places.play.toggle(t("play"), key="w_playing", on_change=request_full_run)  # Play sets the fragment's timer
    if ss.get("w_playing"):
        if runner.finished and ss.step >= runner.generated:
            ss.stop_playing = True
            st.rerun(scope="app")
        ss.step = play_step(ss.step, ss.w_pace)
    else:
        ss.pop("play_clock", None)  # a Play started later starts its own clock
    requested = ss.step
    ss.step = runner.advance_to(requested)
    state, problems = clamp(current_state(), model.info.layers, model.info.q_heads)
    for problem in problems:
        ss["w_" + problem.param] = getattr(state, problem.param)
    ctx = ViewContext(runner=runner, state=state, step=ss.step, trace=runner.trace(ss.step),
                      stage=chapter.stage if chapter else None)
    with places.controls:
        if ss.step < requested:
            st.warning(t("step_unreachable", step=requested, reached=ss.step, reason=runner.stop_reason))
        for problem in problems:
            show_problem(problem)
        ss.counter_html = stepper.counter_html(ctx)
        places.counter.html(ss.counter_html)
    with places.beside:
        stepper.render(ctx, lines=1 if chapter else None)
        if chapter is not None:
            lesson.panel(ctx)
    st.radio(t("view"), VIEWS, key="w_view", horizontal=True, format_func=labels("view_"),
             label_visibility="collapsed")  # hidden in the lesson: the chapter sets the view
    view_place, details_place = st.container(), st.container()
    with details_place:  # sent before the view's figures: the step's text is on screen first
        stepper.details(ctx)
    placed = CHAPTER_FIGURE.set(None if chapter is None else
                                ChapterFigure(chapter.figure, places.chapter_figure, CHAPTER_FIGURE_HEIGHT[ctx.large]))
    try:
        with view_place:
            VIEW_MODULES[ss.w_view].render(ctx)
    finally:
        CHAPTER_FIGURE.reset(placed)
    step_buttons(places.buttons, runner)  # live again only once the screen shows this step, as the link does
    write_link(current_state())


@dataclass(frozen=True)
class PlayClock:
    start: float  # clock() when Play started, or when its pace or step last changed other than by its ticks
    step: int  # the step then
    pace: float
    last: int  # the step Play's last tick set


def play_step(step: int, pace: float) -> int:
    """Play's next step: one more each tick, and more when ticks came late (a slow draw, a busy server), so that
    the tokens keep the pace's clock. A step or pace changed by hand starts the clock again."""
    now, playing = clock(), ss.get("play_clock")
    if playing is None or playing.pace != pace or playing.last != step:
        playing = PlayClock(now, step, pace, step)
    nxt = max(step + 1, playing.step + 1 + int((now - playing.start) / pace + 1e-9))  # + rounding of floats
    ss.play_clock = replace(playing, last=nxt)
    return nxt


@dataclass
class StepPlaces:
    controls: object  # the counter's line, the step buttons and Play, and the step's warnings
    counter: object
    buttons: object  # where `step_buttons` draws (busy first, live once the step is drawn)
    play: object
    beside: object  # the token stream (and the chapter's text in the lesson)
    chapter_figure: object | None  # the lesson's place for the chapter's figure (key `chapter-figure`)


def step_places(chapter) -> StepPlaces:
    """Where the step's parts go. Free exploration: the counter, the step buttons with Play, the token stream, one
    under the other. The lesson: the chapter's title; the counter beside the chapter buttons; the step buttons;
    then the chapter's figure, and beside it the token stream and the chapter's text."""
    if chapter is not None:
        lesson.header(chapter, ss.w_lang)
    controls = st.container()
    with controls:
        if chapter is None:
            counter = header_place(st)
        else:
            counter_column, back, forward = st.columns([2.6, 1, 1], vertical_alignment="center")
            counter = header_place(counter_column)
            lesson.chapter_buttons(chapter, ss.w_lang, go_to_chapter, back, forward)
        buttons_column, play_column = st.columns([4, 1], vertical_alignment="center")
    buttons = buttons_column.empty()
    if chapter is None:
        return StepPlaces(controls, counter, buttons, play_column, controls, None)
    figure_column, beside = st.columns([0.65, 0.35])  # the step picture needs 760 px
    return StepPlaces(controls, counter, buttons, play_column, beside, figure_column.container(key="chapter-figure"))


def header_place(parent):
    """The step's header line, holding the last step's until this step's replaces it: it never blinks out (an
    `st.empty` first would clear it on screen while the step is computed)."""
    return parent.html(ss.counter_html) if "counter_html" in ss else parent.empty()


def fit_to_budget(step: StepLimits) -> None:
    """Clamp settings that would take a step over the host's memory budget, with a message (before the
    sidebar's widgets exist: their values cannot be changed after)."""
    state, problems = fit_state(current_state(), step)
    for problem in problems:
        ss["w_" + problem.param] = getattr(state, problem.param)
    ss.problems = ss.get("problems", []) + problems


def show_problem(problem: Problem) -> None:
    st.warning(t("link_problem", param=problem.param, value=problem.value, fallback=problem.fallback,
                 reason=t("reason_" + problem.reason)))


def step_buttons(place, runner: Runner, busy: bool = False) -> None:
    """Prefill, Back, Next, Reset, drawn in `place`. While a step is computed and drawn (`busy`) they are
    greyed and their arrow keys unbound: Streamlit would merge or drop presses made during a run, so they
    are refused visibly instead. Back and Next move by one from the step current when a press is handled."""
    buttons = (("prefill", "b_prefill", (1, True), {"disabled": ss.step >= 1}),
               ("back", "b_back", (-1, False), {"shortcut": "Left", "disabled": ss.step == 0}),
               ("next", "b_next", (1, False),
                {"shortcut": "Right", "disabled": runner.finished and ss.step >= runner.generated}),
               ("reset", "b_reset", (0, True), {}))
    columns = place.container().columns([1, 1, 1.4, 1])  # Next is the widest label, and pressed most
    for column, (label, key, move_args, options) in zip(columns, buttons):
        if busy:
            column.button(t(label), key=key + "_busy", disabled=True, width="stretch")
            continue
        pressed = column.button(t(label), key=key, on_click=move, args=move_args, width="stretch", **options)
        if pressed and not ss.pop("moved", False):
            # No callback ran: a restarted server rebuilt this session from its link in this very run, and the
            # server that drew the button (and knew its callback) is gone. The press still counts.
            move(*move_args)
            st.rerun()


def move(amount: int, absolute: bool) -> None:
    """A step button's press: go to step `amount`, or by `amount` from the current step."""
    with run_lock():  # callbacks run before main, maybe while a stopped run is still stepping
        ss.step = max(0, amount if absolute else ss.step + amount)
        ss.moved = True

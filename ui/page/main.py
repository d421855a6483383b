"""The Streamlit page: the model and the session's run, the sidebar (`ui.page.sidebar`) and the banners, then the
step's fragment (`ui.page.step`). State and link: `ui.page.page_state`. The numbers come from `ui.runs.runner` (the
engine), figures from `viz`."""

from __future__ import annotations

import logging
from dataclasses import replace

import streamlit as st
import torch

import engine
from engine import timing
from engine.loader import AUTO
from ui.follow import page as follow
from ui.host import memory
from ui.host.limits import DTYPES, Limits, load_limits, model_limits, step_limits
from ui.lesson import chapter_top
from ui.lesson import panel as lesson
from ui.lesson.chapters import WINDOW_PROMPTS
from ui.page import keys, model_card, page_state
from ui.page.page_state import current_state, go_to_chapter, run_config, t
from ui.page.sidebar import play_controls, sidebar
from ui.page.step import stepper_and_view
from ui.runs.classroom import ClassroomCache
from ui.runs.runner import Runner
from ui.runs.store import RunStore
from ui.state.link import clean_prompt
from ui.state.session import lesson_session, page_controls, page_session, settings
from ui.views import cases
from ui.views.flow import PICTURE_CSS

log = logging.getLogger("kvscope")


@st.cache_resource(show_spinner=False, max_entries=3)
def read_model(spec: str) -> engine.Model:
    """Config, tokenizer and weights (the embedded model's are converted on the server's first start), in the
    host's dtype (KVSCOPE_DTYPE, by default each model's own: fixed for the process, so the model's spec alone
    names the cached copy)."""
    dtype = load_limits().dtype
    return engine.load_model(spec, dtype=dtype if dtype == AUTO else getattr(torch, dtype))


@st.cache_resource(show_spinner=False, max_entries=3)
def load_model(spec: str) -> engine.Model:
    """One copy per model for the whole server, shared read-only by every session."""
    model = timing.warm_up(read_model(spec))  # timed steps are then steady-state, not cold
    memory.freeze_long_lived()  # the collector after each script run then skips the model's objects
    # What loading freed goes back now, not at the next sweep: parsing Gemma's 31 MB tokenizer.json leaves ~180 MiB
    # of free heap behind (its tokenizer then holds ~94 MiB).
    memory.release_free_memory()
    return model


LOADED: set[str] = set()  # models this process has loaded: the page shows the loading stages only before
# Streamlit's own chrome a student could take for the app's: the "Running…" man and its Stop button (a step
# shows its own progress: the step buttons grey while it runs). Deploy and the menu go by toolbarMode.
CHROME_CSS = '<style>[data-testid="stStatusWidget"] { visibility: hidden; }</style>'

# The projector's first screen (1280×720) holds the header, the step buttons and the view's main figure: less
# padding above and beside the page, tighter gaps, a one-line title, smaller view headings.
LAYOUT_CSS = """<style>
[data-testid="stMainBlockContainer"] { padding: 2.5rem 2rem 3rem 2rem; }
.st-key-dual-path > [data-testid="stElementContainer"] { flex: 1 1 0; min-width: 0; }  /* halves, or on a phone: */
@media (max-width: 640px) {  /* a phone: the header holds the sidebar's button, the title goes below it */
  [data-testid="stMainBlockContainer"] { padding: 4rem 1rem 3rem 1rem; }
  .st-key-dual-path > [data-testid="stElementContainer"] { flex-basis: 100%; }  /* one under the other */
  /* the view's radio wraps to two lines and would sit on the stream box's border; a legend of two lines too */
  [data-testid="stMain"] .st-key-token-stream { margin-bottom: 0; }
  .kv-legend { margin-bottom: 0.3rem; }
  [class*="st-key-step-buttons"] { gap: 0.25rem; }  /* the four step buttons: one row, its labels get the room */
  [data-testid="stMain"] button kbd { display: none; }  /* a phone has no arrow keys: the label gets the room */
  [data-testid="stMain"] button { padding-left: 0.35rem; padding-right: 0.35rem; }
}
[data-testid="stMain"] [data-testid="stVerticalBlock"] { gap: 0.5rem; }
/* The step buttons share their row 1 : 1 : 1.4 : 1 whatever their labels' lengths: Next, pressed most, the widest. */
[class*="st-key-step-buttons"] > [data-testid="stElementContainer"] { flex: 1 1 0; min-width: 0; }
[class*="st-key-step-buttons"] > [class*="st-key-b_next"] { flex-grow: 1.4; }
[data-testid="stMain"] h1 { font-size: 1.3rem; padding: 0; line-height: 1.3; }
/* A title's text pulls what follows 1rem up (Streamlit's margin under Markdown), which the step's header allows
   for; a banner under the title would cover its lower half. */
.st-key-notices [data-testid="stElementContainer"]:has([data-testid="stHeading"]):not(:last-child) \
{ margin-bottom: 1.25rem; }
/* A first visitor's notices keep the emptied place of the model's loading stages for the session: shown as nothing,
   its container still took a gap above the lesson's title (chapter 6's figure then ended at 721 px, off screen). */
[data-testid="stLayoutWrapper"]:has(> .st-key-notices > :only-child > [data-testid="stEmpty"]) { display: none; }
[data-testid="stMain"] h3 { font-size: 1.15rem; padding-top: 0.25rem; }
/* The token stream is set as HTML, not Markdown: it keeps the -1rem under it that Markdown has, and the page's
   first screen was laid out with (the view's radio, one line on a wide screen, has room above its options). */
.st-key-token-stream { margin-bottom: -1rem; }
/* The view radio's nine options on one line at 1280×720 with large text and the sidebar open: tighter gaps. */
.st-key-w_view [role="radiogroup"] { column-gap: 0.2rem; }
</style>"""
LARGE_CSS = "<style>html { font-size: 125%; }</style>"  # every rem-sized text and control, a quarter larger
# In the lesson the chapter sets the view (its selector is hidden) and its title is the page's: a compact header.
LESSON_CSS = """<style>
.st-key-w_view { display: none; }
.st-key-token-stream { margin-bottom: 0; }  /* the chapter's text under the strip, not on its border */
.st-key-chapter_toc button { justify-content: flex-start; text-align: left; }  /* the chapters, a table of contents */
[data-testid="stMainBlockContainer"] { padding-top: 3.9rem; }  /* the title clears Streamlit's header bar (3.75rem) */
</style>"""


def main() -> None:
    with page_state.page_lock():
        draw_page()


def draw_page() -> None:
    """The whole page: first what must be settled before any widget exists (the state from the link or the
    leader, the model, the session's run and what a chapter's case sets), then the drawing: settings, banners,
    then the step and its view in a fragment (`stepper_and_view`), which a step press, a view or layer change,
    and Play's ticks redraw alone."""
    limits = load_limits()
    # Torch keeps this per thread, and a new thread (a later run, a fragment's) starts from the value set last:
    # every pass computes with the host's count (KVSCOPE_THREADS, in ui/host/limits.py: why one).
    torch.set_num_threads(limits.threads)
    settle_state(limits)
    # The lesson needs the whole projector's width: its chapters are in the sidebar, closed until asked for.
    st.set_page_config(
        page_title="kvscope",
        page_icon="🔎",
        layout="wide",
        initial_sidebar_state="collapsed" if settings.get("chapter") else "auto",
    )
    st.html(CHROME_CSS)
    keys.release_focus_after_clicks()  # → / ← and PageDown / PageUp: the buttons' shortcuts, after any click
    chapter_top.open_chapters_at_the_top()  # a new chapter's figure on the first screen, wherever the last was scrolled
    # Everything shown above the step (a model's loading stages, the title, banners, problems, errors) goes in
    # this one element, whose count varies from run to run: the step's elements keep their places in the page,
    # and Streamlit never meets a keyed element of the step at a new place beside its old one (it would draw
    # neither).
    notices = st.container(key="notices")
    memory.tune_allocator()
    model, failure = model_for(settings.model, notices)  # a model's first load shows its stages
    limits = model_limits(limits, model.info) if model is not None else limits  # a smaller K/V: longer runs
    runner = prepare_run(model, limits) if model is not None else None
    draw(limits, model, failure, runner, notices)


def settle_state(limits: Limits) -> None:
    """The session's settings for this run, before any widget: from the link (the first run), what Streamlit
    lost or a stale request took back, the leader's state for a follower."""
    page = page_session()
    if not page.from_link:
        page_state.start_from_link(limits)
    page_state.restore_lost_settings()
    page_state.undo_stale_echoes()  # before the leader's state: a follower's push carries the browser's last values
    page.echoes_undone = True
    # Before any widget, as the link is.
    follow.take_over(lambda query, own: page_state.follow_leader(query, limits, own))
    if page.stop_playing:
        page_controls.playing, page.stop_playing = False, False
    page.whole_page_due = False  # this run is one


def prepare_run(model: engine.Model, limits: Limits) -> Runner:
    """The session's run, and what it changes in the settings before the widgets show them: a chapter's fresh
    cache or case, the chat switch on a base model, the host's step budget."""
    runner = runner_for(model, limits)
    if lesson_session().take("forget_published"):
        runner.forget_published()
    apply_pending_case(runner, limits)  # it sets the prompt and chat switch
    apply_window_prompt(model)
    page_state.chat_problem(runner.can_chat)  # a base model: its prompt goes in as it is
    page_state.fit_to_budget(step_limits(limits, model.info))
    return runner


def draw(limits: Limits, model: engine.Model | None, failure: str, runner: Runner | None, notices) -> None:
    """The page's widgets: header, banners and problems, the sidebar, then the step's fragment (or why there is
    no model), the model card and the tagline."""
    in_lesson = bool(settings.get("chapter"))
    st.html(LAYOUT_CSS + PICTURE_CSS + (LARGE_CSS if settings.large else "") + (LESSON_CSS if in_lesson else ""))
    with notices:
        if not in_lesson:  # a lesson's header is its chapter's title
            st.title(t("title"))
        follow.show(t)
        page = page_session()
        for problem in page.problems:
            page_state.show_problem(problem)
        page.take("problems")  # once all are shown: a run stopped midway leaves them to the next
        if limits.bad_dtype:
            st.warning(t("dtype_bad", value=limits.bad_dtype, allowed=" / ".join(DTYPES), used=limits.dtype))
    # After the banner: it reaches the screen first.
    sidebar(limits, can_think=runner is not None and runner.can_think, can_chat=runner is None or runner.can_chat)
    if model is None:
        with notices:
            st.error(failure)
            st.button(t("use_default"), key="use_default", on_click=page_state.use_default_model)
        return
    state = current_state()
    prompt, reasons = clean_prompt(state.prompt)
    for reason in reasons:
        notices.warning(t("prompt_cleaned", reason=t("reason_" + reason)))
    try:
        runner.configure(run_config(replace(state, prompt=prompt), limits))
    except engine.KvscopeError as error:
        message = t("bad_input", error=page_state.engine_error(error))
        if in_lesson:  # the chapter stays on screen, with the way on and back to a prompt that runs
            lesson.stalled(settings.chapter, settings.lang, message, go_to_chapter, page_state.use_lesson_prompt)
        else:
            notices.error(message)
        page_state.write_link(state)
        return
    play_controls(limits)
    pace = page_controls.pace if page_controls.get("playing") else None
    st.fragment(run_every=pace)(stepper_and_view)(model, runner)
    model_card.render(model.info, t)  # at the foot, collapsed: the first screen is the step's
    st.caption(t("tagline"))  # at the foot: the first screen is for the step and its figure


# -- the model and the run ----------------------------------------------------------------------


def model_for(spec: str, place) -> tuple[engine.Model | None, str]:
    """The shared model, or None and a message saying why it could not be loaded."""
    try:
        return (load_model(spec) if spec in LOADED else load_with_stages(spec, place)), ""
    except (engine.KvscopeError, OSError, MemoryError) as error:
        return None, t("model_failed", model=spec, error=str(error) or type(error).__name__)
    except Exception as error:  # noqa: BLE001 — any loading fault is shown, never a traceback
        log.error("loading a model failed: %s", type(error).__name__, exc_info=True)
        return None, t("model_failed", model=spec, error=f"{type(error).__name__}: {error}")


def load_with_stages(spec: str, parent) -> engine.Model:
    """Load a model this process has not loaded yet, saying what it is doing (17–49 s on a first start)."""
    place = parent.empty()
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


@st.cache_resource(show_spinner=False, max_entries=3)
def classroom_cache(spec: str, tokens: int, lease_seconds: int) -> ClassroomCache:
    """The class-wide prefix cache (only when the host turns it on): one per model for the server."""
    return ClassroomCache(load_model(spec), tokens, lease_seconds)


@st.cache_resource(show_spinner=False, max_entries=3)
def run_store(spec: str, max_bytes: int) -> RunStore:
    """The runs pages share, one store per model for the server; the server's sweeper drops its idle runs."""
    store = RunStore(max_bytes)
    memory.sweep_regularly(store.expire)
    return store


def runner_for(model: engine.Model, limits: Limits) -> Runner:
    """This browser session's view of a run: on the class's prefix cache when the host shares one, else a run
    shared with every page that has the same settings and prompt history."""
    page = page_session()
    runner = page.runner
    if runner is None or runner.model is not model:
        if runner is not None:
            runner.close()
        store = run_store(settings.model, limits.shared_runs_mb * 10**6)  # the eviction labs, the two-contexts K/V
        runs = (
            classroom_cache(settings.model, limits.shared_cache_tokens, limits.lease_seconds)
            if limits.shared_prefix_cache
            else store
        )
        runner = page.runner = Runner(model, limits.cache_tokens, limits.full_traces, runs, limits, store=store)
    return runner


def apply_pending_case(runner: Runner, limits: Limits) -> None:
    """The article's cases: the cached prompt alone published (prefilled at the case's settings), then the edit."""
    which = lesson_session().take("pending_case")
    if which is None:
        return
    settings.chat = False
    settings.block_size = cases.CASE_BLOCK_SIZE  # small enough for the block policy's reuse to show
    settings.view = "prefix"
    runner.publish_alone(run_config(replace(current_state(), prompt=cases.CASE_CACHED), limits))
    settings.prompt = cases.CASES[which]


def apply_window_prompt(model: engine.Model) -> None:
    """The sliding-window chapter on a model with a window: the lesson's prompt long enough to pass it (on a model
    without one, the chapter shows what it keeps instead, on the class's prompt)."""
    if lesson_session().take("pending_window_prompt") and model.info.sliding_window is not None:
        settings.prompt = WINDOW_PROMPTS.get(settings.lang, WINDOW_PROMPTS["en"])

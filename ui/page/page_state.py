"""The page's state: its settings in Streamlit's session state (`w_<setting>` keys, one per `AppState` field) and
its step (`ui.state.session.PageSession`), read from and written to the page's link, the lesson's chapters entered, and
today's language for text. Shared by the page (`ui.page.main`) and the step's fragment (`ui.page.step`); draws
nothing but the problems it is given.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import fields, replace
from urllib.parse import parse_qsl

import streamlit as st

import engine
from ui.follow import follower, leader
from ui.follow import page as follow
from ui.follow.room_link import OWN
from ui.host import streamlit_internals
from ui.host.limits import Limits, StepLimits, fit_state
from ui.lesson.chapters import CHAPTERS, WINDOW_PROMPTS
from ui.runs.run import RunConfig
from ui.state.link import (
    CHOICES,
    AppState,
    Problem,
    default_prompt,
    language_defaults,
    link_holds,
    parse_query,
    to_query,
)
from ui.state.session import lesson_session, page_session, settings
from ui.text import strings
from ui.views import cases
from ui.views.widgets import HEAD_VIEWS
from viz.attention import focused_head

log = logging.getLogger("kvscope")


def t(key: str, **values) -> str:
    """A string in today's language; the values (link values, prompts, model ids, errors) show as text."""
    return strings.t(key, settings.get("lang", "en"), **values)


def labels(prefix: str):
    """A format_func for options whose labels are strings `prefix + option`, in today's language."""
    lang = settings.get("lang", "en")
    return lambda option: strings.t(prefix + option, lang)


def page_lock() -> threading.RLock:
    """The lock on this page's step and runner: one script run of the session at a time (`PageSession.page_lock`)."""
    return page_session().page_lock


def request_whole_page() -> None:
    """A control inside the step's fragment changed what the rest of the page shows (the chapter and its
    settings, Play, an article's case): the fragment's next run hands over to a run of the whole page."""
    page_session().whole_page_due = True


def start_from_link(limits: Limits) -> None:
    apply_link(st.query_params.to_dict(), limits)
    page_session().from_link = True


def follow_leader(query: dict[str, str], limits: Limits, own: frozenset[str] = OWN) -> None:
    """A follower takes the leader's state (`query`: the leader's link), keeping its `own` settings (its language
    and text size)."""
    apply_link(query, limits, mine=own)
    page_session().stop_playing = True  # the leader's steps drive this page now


def apply_link(params: dict[str, str], limits: Limits, mine: frozenset[str] = frozenset()) -> None:
    """Put the page in the state a link's `params` describe, except the settings named in `mine`, which stay.
    A chapter is entered only when it changes (its case runs once). `lesson=<n>`, a link typed by hand, opens
    chapter n as `chapter=<n>` does. Whether the link asked for the chat template is kept for the page's check
    against the model (`chat_problem`): a problem is shown only for what a link asked."""
    if "lesson" in params and "chapter" not in params:
        params = {**params, "chapter": params["lesson"]}
    state, problems = parse_query(params)
    if "lesson" in params and params["lesson"] == params.get("chapter"):
        problems = [replace(p, param="lesson") if p.param == "chapter" else p for p in problems]
    page = page_session()
    page.chat_asked = "chat" in params and state.chat and "chat" not in mine
    if not limits.model_allowed(state.model):
        problems.append(Problem("model", state.model[:80], "embedded", "model_not_allowed"))
        state = replace(state, model="embedded")
    chapter_before = settings.get("chapter")
    for f in fields(AppState):
        if f.name != "step" and f.name not in mine:
            settings[f.name] = getattr(state, f.name)
    page.step = state.step
    page.problems += problems
    if state.chapter and state.chapter != chapter_before:
        enter_chapter(state.chapter, keep=frozenset(params))  # the link's own values stay


SIDEBAR_SETTINGS = ("block_size", "kv_splits", "prompt", "chat")  # what a chapter may set that the sidebar shows


def go_to_chapter(number: int) -> None:
    """A lesson control's press: chapter `number` (0 leaves the lesson, keeping the page as it is). A chapter that
    keeps the sidebar's settings redraws the step's fragment alone (most do: only the view, step and stage change);
    entering or leaving the lesson, an article's case, and a chapter with another block size or split count draw
    the whole page again."""
    with page_lock():
        in_lesson, settings_before = bool(settings.get("chapter")), sidebar_settings()
        enter_chapter(number)
        lesson = lesson_session()
        if (
            not (in_lesson and number)
            or sidebar_settings() != settings_before
            or lesson.pending_case
            or lesson.pending_window_prompt
        ):
            request_whole_page()


def sidebar_settings() -> list:
    return [settings.get(name) for name in SIDEBAR_SETTINGS]


def enter_chapter(number: int, keep: frozenset[str] = frozenset()) -> None:
    """Put the page in chapter `number`'s state: its view, step, block size and split count, and the article's
    case where it has one. Settings named in `keep` stay as they are, but for the view: the lesson hides the view's
    selector, and its figure is the chapter's. The prompt and sampling are the class's."""
    settings.chapter = number
    if not number:
        return
    chapter, lesson = CHAPTERS[number - 1], lesson_session()
    if "step" not in keep:
        page_session().step = chapter.step
    for name, value in {"view": chapter.view, **chapter.settings}.items():
        if name not in keep or name == "view":
            settings[name] = value
    if chapter.case:
        lesson.pending_case = chapter.case
        if settings.get("prompt") not in cases.CASE_PROMPTS:  # a case turns the chat switch off: put it back after
            lesson.chat_before_case = settings.get("chat", language_defaults(settings.get("lang", "en")).chat)
    else:  # a chapter's run starts from an empty prefix cache: the same run on every visit, for every page
        lesson.forget_published = True
        if settings.prompt in cases.CASE_PROMPTS and "prompt" not in keep:  # back from a case: the usual prompt, and
            # the chat switch the page had before it (never one the model cannot use: a base model has no template)
            settings.prompt = default_prompt(settings.lang)
            before = lesson.take("chat_before_case")
            settings.chat = language_defaults(settings.lang).chat if before is None else before
        elif settings.prompt in WINDOW_PROMPTS.values() and "prompt" not in keep:  # back from the window's chapter
            settings.prompt = default_prompt(settings.lang)
        if chapter.window_prompt and "prompt" not in keep:  # set once the model is known (`page.apply_window_prompt`)
            lesson.pending_window_prompt = True
    if chapter.view in HEAD_VIEWS and not {"layer", "head"} & keep:
        # open on the head with a pattern in the chapter's own run, whatever head the class came from: the chapter's
        # text names it, and must read the same on every visit
        settings.layer, settings.head = 0, 0
        page = page_session()
        page.focused_head_chosen, page.focus_from_chapter = False, True


def switch_language() -> None:
    """A page switched language: what is still the old language's default (its model with its chat switch, its
    prompt) becomes the new one's, so a page switched to Chinese on the default model opens on the Chinese model.
    A follower's language is its own: the teacher's model and prompt stay."""
    if follow.follows_a_room():
        return
    old = language_defaults(page_session().drawn_state.get("lang", AppState.lang))
    new = language_defaults(settings.lang)
    if settings.model == old.model:
        settings.model, settings.chat = new.model, new.chat
    if settings.prompt in (old.prompt, WINDOW_PROMPTS.get(old.lang)):
        settings.prompt = new.prompt
        chapter = settings.get("chapter")  # the window chapter's own prompt comes back in the new language, on a model
        lesson_session().pending_window_prompt = bool(chapter) and CHAPTERS[chapter - 1].window_prompt  # with a window


def use_default_model() -> None:
    settings.model = "embedded"


def use_lesson_prompt() -> None:
    """The lesson's own prompt and chat switch for the page's language, in place of one that cannot run."""
    defaults = language_defaults(settings.lang)
    settings.prompt, settings.chat = defaults.prompt, defaults.chat


def current_state() -> AppState:
    """The page's state from its widgets (a setting whose widget is not drawn yet keeps its default). Read a few
    times per run of every page: one look-up per setting (each goes through Streamlit's session proxy)."""
    return AppState(step=page_session().step, **settings.values())


def restore_lost_settings() -> None:
    """Put back any setting whose widget state Streamlit dropped (the last state drawn is kept under a key no
    widget owns): a text area that lost its state would come back empty, and the page would refuse to run. Seen
    once under a class's load, as a page whose link turned to `prompt=` with nobody typing."""
    drawn = page_session().drawn_state
    for name, value in drawn.items():
        if name not in settings:
            log.warning("setting %s was lost by its widget and restored", name)  # the name only, never the value
            settings[name] = value
    for name, options in CHOICES.items():  # a drop-down's labels change with the language: the browser may send
        if settings.get(name, options[0]) not in options:  # back the old label of the option it showed
            settings[name] = drawn.get(name, getattr(AppState, name))


def undo_stale_echoes() -> None:
    """Put back what a stale request took from the page's settings, as a run begins (before any widget). Each request
    carries the browser's copy of every widget's value, and Streamlit takes it over the page's own: a request sent
    before the page's last draw reached the browser (a timed fragment's tick, a follower's push) carries the values
    from before that draw and undoes what the page set. Seen in CI: the teacher's page entered chapter 10 with blocks
    of 4; the follow strip's tick, sent a moment before, put chapter 9's blocks of 16 back, and the chapter's text
    then said 16. Such a request also carries the link the browser had then: a setting whose value is that link's,
    where the page means another (what it set since it last drew, else what it drew), is the echo and goes back."""
    query = streamlit_internals.request_link()
    meant = page_session().drawn_state | settings.written()
    if not meant or query is None:
        return
    sent = dict(parse_qsl(query, keep_blank_values=True))
    for name, value in meant.items():
        now = settings.get(name)
        if now != value and link_holds(sent, name, now) and not link_holds(sent, name, value):
            log.info("a stale request's %s was put back", name)  # the name only, never the value
            settings[name] = value


def write_link(state: AppState) -> None:
    page_session().drawn_state = {f.name: getattr(state, f.name) for f in fields(AppState) if f.name != "step"}
    settings.forget_written()  # drawn: from now on a request's older value for them is an echo
    leader.publish(state)  # a leader's every draw (a play tick too) reaches its followers
    follower.check(state)  # a follower's own move (Play's tick too) leaves following
    # Sent on every draw, even when Streamlit's copy of the link already holds it: that copy is shared by a
    # session's runs, and a run stopped for a newer one (Streamlit's fast reruns start the newer before the older
    # has stopped) can write it after the newer run read the browser's link, then be stopped inside the send. The
    # newer run would find the copy up to date and the browser's link would stay a step behind its screen. An
    # unchanged link leaves the browser's history alone.
    st.query_params.from_dict(to_query(state) | follow.link_params())


def open_on_focused_head(state: AppState, trace: engine.StepTrace | None) -> AppState:
    """Once per browser session (and on entering a chapter that shows a head), when the link chose no layer or head
    and nobody has picked one, start the layer and head pickers on a head whose attention shows a pattern (layer 0,
    head 0 is usually diffuse). The step calls it before its views get their state, which it returns."""
    page = page_session()
    if page.focused_head_chosen or trace is None or trace.attention is None:
        return state
    from_chapter, page.focused_head_chosen = page.take("focus_from_chapter"), True
    linked = not from_chapter and ("layer" in st.query_params or "head" in st.query_params)
    if linked or (state.layer, state.head) != (0, 0):  # the link's head (not the last chapter's), or one picked
        return state
    settings.layer, settings.head = focused_head(trace.attention[:, :, -1].float().numpy())
    return replace(state, layer=settings.layer, head=settings.head)


def load_case(which: str) -> None:
    """The prefix view's press: publish the article's cached prompt, then load the edited one, at its prefill (the
    prefill looks it up). A chapter's case takes the chapter's (or link's) step instead."""
    lesson_session().pending_case, page_session().step = which, 1


def measure_again() -> None:
    """The costs view's press: its timings are measured anew (a new count, a new cache entry)."""
    page_session().measured_again += 1


def run_config(state: AppState, limits: Limits) -> RunConfig:
    return RunConfig(
        prompt=state.prompt,
        chat=state.chat,
        think=state.think,
        sampling=engine.Sampling(
            temperature=float(state.temperature), top_k=int(state.top_k), top_p=float(state.top_p), seed=int(state.seed)
        ),
        block_size=int(state.block_size),
        kv_splits=int(state.kv_splits),
        policy=state.policy,
        max_new_tokens=limits.max_new_tokens,
        max_prompt_tokens=limits.max_prompt_tokens,
    )


def chat_problem(can_chat: bool) -> None:
    """A model without a chat template (a base model) takes its prompt as it is: the chat switch goes off, and a
    link that asked for chat=1 is told why. A switch that was on by default, by the language or by a chapter
    goes off without a word: nobody asked for it."""
    page = page_session()
    asked = page.take("chat_asked")
    if settings.chat and not can_chat:
        settings.chat = False
        if asked:
            page.problems.append(Problem("chat", "1", "0", "no_chat_template"))


# The engine's errors a page meets with its own input, as the engine words them (English), and the string the page
# shows instead in its language (ui/text/strings.csv); the numbers and names in them are kept.
ENGINE_ERRORS = (
    (r"the prompt is (?P<length>\d+) tokens; this app allows at most (?P<limit>\d+)$", "error_prompt_over_host"),
    (
        r"the prompt is (?P<length>\d+) tokens; (?P<model>.+) reads at most (?P<limit>\d+) positions, "
        r"so a prompt can have at most (?P<most>\d+) tokens to leave room for an answer$",
        "error_prompt_over_model",
    ),
    (r"the prompt is empty; type some text$", "error_prompt_empty"),
    (r"the prompt has no token ids$", "error_prompt_no_ids"),
    (r"(?P<model>.+) has no chat template; switch the chat option off$", "error_no_chat_template"),
)


def engine_error(error: Exception) -> str:
    """An engine error in the page's language: one the page's input can cause, reworded with its numbers; any
    other as the engine said it."""
    message = str(error)
    for pattern, key in ENGINE_ERRORS:
        found = re.match(pattern, message)
        if found:
            values = {name: int(value) if value.isdigit() else value for name, value in found.groupdict().items()}
            return t(key, **values)
    return message


def show_problem(problem: Problem) -> None:
    st.warning(
        t(
            "link_problem",
            param=problem.param,
            value=problem.value,
            fallback=problem.fallback,
            reason=t("reason_" + problem.reason),
        )
    )


def fit_to_budget(step: StepLimits) -> None:
    """Clamp settings that would take a step over the host's memory budget, with a message (before the
    sidebar's widgets exist: their values cannot be changed after)."""
    state, problems = fit_state(current_state(), step)
    for problem in problems:
        settings[problem.param] = getattr(state, problem.param)
    page_session().problems += problems

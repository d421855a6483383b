"""A round of the class's answers as a page sees it (`AskRound`, in the view's context; `ui.follow.class_answers` holds
the rules): on the teacher's page, how many answered and the round's controls (ask, close, reveal, hide a token, ask
again, export); on a student's, the box that sends their guess and the token it became; on every page of the room,
the reveal once shown. The intents are the buttons' callbacks.

Only the leading page changes the round, and only through its own link, which its room publishes: a student's page
holds no control that changes the room. A student's send is taken only while the room, as this server last read it,
has that round open.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import streamlit as st

from engine.prompt import control_texts
from ui.follow import class_answers
from ui.follow.class_answers import Reveal, answers_key, counts_of, ids_of, tally_of, tally_text
from ui.follow.class_prompts import PromptRefused
from ui.follow.room_link import follow_state, sync
from ui.follow.teacher_browser import set_cookie
from ui.state.link import AppState
from ui.state.session import page_session, settings, view_controls

BROWSER_COOKIE = "kvscope_browser"
BROWSER_KEEP_SECONDS = 12 * 3600  # a school day
SEND_GAP_SECONDS = 1.0  # a page's guesses: one every so often; a flood is refused, not stored
SEND_WAIT_SECONDS = 1.0  # a send waits this long for the store to take it before saying it could not yet
GUESS = "ask_guess"  # the student's box (a view control)
GUESS_KEY = view_controls.key(GUESS)
clock = time.monotonic  # tests move it by hand


@dataclass(frozen=True)
class AskRound:
    role: str  # "lead" or "follow"
    number: int  # the round (0: none open at this step)
    phase: str  # "open", "closed" or "shown"
    can_ask: bool  # the teacher may open a round here (the run goes on past this step)
    mine: tuple[int, bool] | None  # the token this browser sent in this round, and whether the store has it
    message: tuple[str, dict] | None  # the outcome of this page's last send, shown once
    error: str | None  # why the store cannot be used now
    reveal: Reveal | None  # once shown
    open: Callable[[], None] = field(default=lambda: None)
    close: Callable[[], None] = field(default=lambda: None)
    show: Callable[[], None] = field(default=lambda: None)
    hide: Callable[[int], None] = field(default=lambda token: None)
    send: Callable[[], None] = field(default=lambda: None)
    export: Callable[[], str] = field(default=lambda: "")


def browser_id() -> str:
    """This browser's id for its answers, from its cookie (made and kept there on a first visit)."""
    mine = follow_state()
    if not mine.browser:
        given = st.context.cookies.get(BROWSER_COOKIE)
        mine.browser = given if class_answers.is_browser_id(given) else class_answers.new_browser_id()
    return mine.browser


def keep_browser_id() -> None:
    """Keep the id in the browser's cookie (the script `teacher_browser.set_cookie` draws)."""
    set_cookie(BROWSER_COOKIE, browser_id(), BROWSER_KEEP_SECONDS)


def at_step(state: AppState, step: int) -> AppState:
    """The leader's state at `step`: a round opened at another step has ended (→ goes on as usual)."""
    mine = follow_state()
    if mine.role != "lead" or not state.ask:
        return state
    if mine.ask_step is None:
        mine.ask_step = step  # a reload: the round is the link's, at the link's step
    if mine.ask_step == step:
        return state
    end_round()
    return replace(state, ask=0, ask_phase="open", ask_tally="", ask_hide="")


def round_for(state: AppState, step: int, runner) -> AskRound | None:
    """The round this page shows at `step` (None: it neither leads nor follows a room, or follows on its own)."""
    mine = follow_state()
    if mine.role == "follow" and mine.mode != "following" or mine.role not in ("lead", "follow"):
        return None
    room_sync = sync()
    error = mine.error if room_sync is None else room_sync.error
    key = answers_key(mine.code, state.ask)
    mine_sent = None
    if mine.role == "lead":  # the leader's strip says how many answered, each second (`leader.lead_status`)
        mine.ask_counting = (state.ask, state.ask_phase) if state.ask and state.ask_phase != "shown" else None
        answered(room_sync, mine.code, mine.ask_counting)  # read from now on
    if state.ask and room_sync is not None:
        if mine.answer is not None and mine.answer[0] == state.ask:
            mine_sent = (mine.answer[1], room_sync.sent(key, browser_id()))
    message, mine.ask_message = mine.ask_message, None
    shown = reveal_of(state, step, runner) if state.ask and state.ask_phase == "shown" else None
    if shown is not None and mine.role == "lead":
        mine.asked[state.ask] = export_rows(shown, state, step, runner)
    can_ask = not runner.finished or step < runner.generated
    return AskRound(mine.role, state.ask, state.ask_phase, can_ask, mine_sent, message, error, shown,
                    open_round, close_round, show_round, hide_token, send_guess, export)


def reveal_of(state: AppState, step: int, runner) -> Reveal | None:
    """The round's reveal from this page's run: the step after `step` picks the token (None: the run ends here)."""
    if runner.advance_to(step + 1) < step + 1:
        return None
    trace = runner.trace(step + 1)
    counts = tally_of(state.ask_tally) or {}
    return class_answers.reveal(trace.logits, runner.config.sampling, trace.token_id, counts,
                                ids_of(state.ask_hide) or frozenset())


def answered(room_sync, code: str, counting: tuple[int, str] | None) -> tuple[str, dict] | None:
    """What the leader's strip says of the round it counts (`counting`: its number and phase): how many answered,
    as the rooms' thread last read the round (a strings key and its values)."""
    if counting is None or room_sync is None:
        return None
    tally = room_sync.tally(answers_key(code, counting[0]))
    return "ask_count_" + counting[1], {"n": "…" if tally is None else len(tally)}


def export_rows(shown: Reveal, state: AppState, step: int, runner) -> list[dict]:
    asked = list(follow_state().asked)
    number = asked.index(state.ask) + 1 if state.ask in asked else len(asked) + 1  # rounds in the order asked
    drawn = {bar.token_id for bar in shown.bars}
    bars = list(shown.bars) + [bar for bar in shown.guesses if bar.token_id not in drawn]  # every guess, too
    cells = runner.candidate_cells(step + 1, [bar.token_id for bar in bars])
    return [{"chapter": state.chapter or "", "round": number, "kind": "predict", "step": step,
             "token": "" if bar.hidden else cell.text, "token_id": bar.token_id, "count": bar.count,
             "probability": f"{bar.probability:.6g}", "picked": int(bar.picked)}
            for bar, cell in zip(bars, cells, strict=True)]


def export() -> str:
    """The lesson's revealed rounds as CSV, in the order they were asked."""
    asked = follow_state().asked
    return class_answers.export_csv([row for number in asked for row in asked[number]])


# -- the teacher's intents: changes of the leading page's own link, which its room publishes -----------------------

def leads() -> bool:
    return follow_state().role == "lead"


def open_round() -> None:
    """Ask: a new round at this step, open for answers (a round asked again is a new round: its answers start empty)."""
    if not leads():
        return
    follow_state().ask_step = page_session().step
    settings.ask, settings.ask_phase = secrets.randbelow(999_999) + 1, "open"  # unguessable ahead of its asking
    settings.ask_tally = settings.ask_hide = ""


def close_round() -> None:
    if leads() and settings.get("ask"):
        settings.ask_phase = "closed"


def show_round() -> None:
    """Reveal: the answers as the store has them now, counted per token into the link."""
    mine, room_sync = follow_state(), sync()
    if not leads() or not settings.get("ask") or room_sync is None:
        return
    key = answers_key(mine.code, settings.ask)
    room_sync.tally(key)
    room_sync.settle(timeout=SEND_WAIT_SECONDS)  # a read that started after the click
    tally = room_sync.tally(key)
    if tally is None:
        mine.ask_message = ("ask_store_down", {"error": room_sync.error or ""})
        return
    settings.ask_tally, settings.ask_phase = tally_text(counts_of(tally)), "shown"


def hide_token(token: int) -> None:
    if leads() and settings.get("ask"):
        hidden = (ids_of(settings.get("ask_hide", "")) or frozenset()) | {token}
        settings.ask_hide = ",".join(map(str, sorted(hidden)))


def end_round() -> None:
    settings.ask, settings.ask_phase, settings.ask_tally, settings.ask_hide = 0, "open", "", ""
    follow_state().ask_step = None


# -- a student's send -------------------------------------------------------------------------------------------

def send_guess() -> None:
    """A student's Send: the guess, checked, as the token it becomes, into the round's answers (this browser's one
    answer: a second send replaces it)."""
    mine, room_sync = follow_state(), sync()
    now, last = clock(), mine.ask_tried_at
    mine.ask_tried_at = now
    try:
        if last is not None and now - last < SEND_GAP_SECONDS:
            raise PromptRefused("too_fast", seconds=SEND_GAP_SECONDS)
        number = open_round_number()
        runner, step = page_session().runner, page_session().step
        text = class_answers.checked_guess(str(view_controls.get(GUESS, "")), control_texts(runner.model.tokenizer))
        ids = runner.prompt_ids + runner.session.generated[:step]
        prompt, answer = runner.texts(step)
        token = class_answers.guess_token(runner.model.tokenizer, ids[-1], prompt + answer, text)
        if room_sync is None:
            raise PromptRefused("store_down", error=mine.error or "")
        key = answers_key(mine.code, number)
        room_sync.answer(key, browser_id(), str(token))
        mine.answer = (number, token)
        view_controls[GUESS] = ""
        sent = room_sync.settle(timeout=SEND_WAIT_SECONDS) and room_sync.sent(key, browser_id())
        mine.ask_message = ("ask_sent" if sent else "ask_kept", {})
    except PromptRefused as refused:
        mine.ask_message = ("ask_refused_" + refused.reason, refused.values)


def open_round_number() -> int:
    """The round the room has open, as this server last read it, and this page shows; else PromptRefused("closed")."""
    mine, room_sync = follow_state(), sync()
    seen = room_sync.watch(mine.code) if room_sync is not None and mine.tracking else None
    query = seen.room.query if seen is not None and seen.room is not None else {}
    number = int(query.get("ask", "0")) if query.get("ask", "0").isdigit() else 0
    if not number or query.get("ask_phase", "open") != "open" or number != settings.get("ask"):
        raise PromptRefused("closed")
    return number

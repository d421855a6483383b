"""A student's send in a round of the class's answers (`ui.follow.ask_round`): this browser's one guess or vote, checked
and sent to the round the room has open, under this browser's id, kept in its cookie. A flood is refused, not
stored."""

from __future__ import annotations

import time
from collections.abc import Callable

import streamlit as st

from engine.prompt import control_texts
from ui.follow import class_answers
from ui.follow.class_answers import answers_key
from ui.follow.class_prompts import PromptRefused
from ui.follow.class_votes import checked_vote
from ui.follow.room_link import follow_state, sync
from ui.follow.teacher_browser import set_cookie
from ui.state.session import page_session, settings, view_controls

BROWSER_COOKIE = "kvscope_browser"
BROWSER_KEEP_SECONDS = 12 * 3600  # a school day
SEND_GAP_SECONDS = 1.0  # a page's guesses: one every so often; a flood is refused, not stored
SEND_WAIT_SECONDS = 1.0  # a send waits this long for the store to take it before saying it could not yet
GUESS = "ask_guess"  # the student's box (a view control)
GUESS_KEY = view_controls.key(GUESS)
VOTE = "ask_vote"  # the student's choice (a view control)
VOTE_KEY = view_controls.key(VOTE)
clock = time.monotonic  # tests move it by hand


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


def send_guess() -> None:
    """A student's Send: the guess, checked, as the token it becomes, into the round's answers (this browser's one
    answer: a second send replaces it)."""

    def token() -> int:
        runner, step = page_session().runner, page_session().step
        text = class_answers.checked_guess(str(view_controls.get(GUESS, "")), control_texts(runner.model.tokenizer))
        ids = runner.prompt_ids + runner.generation.generated[:step]
        prompt, answer = runner.texts(step)
        return class_answers.guess_token(runner.model.tokenizer, ids[-1], prompt + answer, text)

    if send(token):
        view_controls[GUESS] = ""


def send_vote(count: int) -> None:
    """A student's vote: the choice's place among the `count` this page shows (this browser's one vote: a second
    send replaces it)."""

    def choice() -> int:
        chosen = checked_vote(view_controls.get(VOTE), count)
        if chosen is None:
            raise PromptRefused("no_choice")
        return chosen

    send(choice)


def send(answer: Callable[[], int]) -> bool:
    """This browser's answer to the open round (`answer()`: the page's token or choice, checked, or PromptRefused),
    into the round's answers map through the process's RoomSync; the outcome is the page's message. One send a
    `SEND_GAP_SECONDS`: a flood is refused, not stored."""
    mine, room_sync = follow_state(), sync()
    now, last = clock(), mine.ask_tried_at
    mine.ask_tried_at = now
    try:
        if last is not None and now - last < SEND_GAP_SECONDS:
            raise PromptRefused("too_fast", seconds=SEND_GAP_SECONDS)
        number = open_round_number()
        value = answer()
        if room_sync is None:
            raise PromptRefused("store_down", error=mine.error or "")
        key = answers_key(mine.code, number)
        room_sync.answer(key, browser_id(), str(value))
        mine.answer = (number, value)
        sent = room_sync.settle(timeout=SEND_WAIT_SECONDS) and room_sync.sent(key, browser_id())
        mine.ask_message = ("ask_sent" if sent else "ask_kept", {})
        return True
    except PromptRefused as refused:
        mine.ask_message = ("ask_refused_" + refused.reason, refused.values)
        return False


def open_round_number() -> int:
    """The round the room has open, as this server last read it (while the store fails, as this page last followed
    it: its send is kept until the store answers), and this page shows; else PromptRefused("closed")."""
    mine, room_sync = follow_state(), sync()
    seen = room_sync.watch(mine.code) if room_sync is not None and mine.tracking else None
    query = {}
    if seen is not None and seen.room is not None:
        query = seen.room.query
    elif seen is not None and seen.error and mine.seen is not None:
        query = mine.seen[1]
    number = int(query.get("ask", "0")) if query.get("ask", "0").isdigit() else 0
    if not number or query.get("ask_phase", "open") != "open" or number != settings.get("ask"):
        raise PromptRefused("closed")
    return number

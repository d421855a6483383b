"""The teacher's intents on a round of the class's answers (`ui.follow.ask_round`): ask, vote, vote again, close,
reveal, hide a token. Each changes only the leading page's own link, which its room publishes, so a round is what
the teacher's link says it is."""

from __future__ import annotations

import secrets

from ui.follow.ask_student import SEND_WAIT_SECONDS
from ui.follow.class_answers import answers_key, counts_of, ids_of, tally_text
from ui.follow.class_votes import LETTERS, moves_of, moves_text
from ui.follow.room_link import follow_state, sync
from ui.state.session import page_session, settings


def leads() -> bool:
    return follow_state().role == "lead"


ENDED = {
    "ask": 0,
    "ask_kind": "predict",
    "ask_phase": "open",
    "ask_tally": "",
    "ask_hide": "",
    "ask_first": 0,
    "ask_before": "",
    "ask_moves": "",
}  # the link's fields of no round


def open_round(kind: str = "predict") -> None:
    """Ask: a new round at this step, open for answers (a round asked again is a new round: its answers start empty)."""
    if not leads():
        return
    end_round()  # the round before, if any, with what it kept
    follow_state().ask_at = (page_session().step, settings.get("chapter", 0))
    settings.ask, settings.ask_kind = secrets.randbelow(999_999) + 1, kind  # unguessable ahead of its asking


def open_vote() -> None:
    open_round("vote")


def vote_again() -> None:
    """Vote again, after a vote's reveal and the class's discussion: a new round that keeps the one before's number and
    counts, to count at its reveal who changed their vote."""
    if not leads() or settings.get("ask_kind") != "vote" or settings.get("ask_phase") != "shown":
        return
    first, before = settings.ask, settings.ask_tally
    open_round("vote")
    settings.ask_first, settings.ask_before = first, before


def close_round() -> None:
    if leads() and settings.get("ask"):
        settings.ask_phase = "closed"


def show_round() -> None:
    """Reveal: the answers as the store has them now, counted per token into the link."""
    mine, room_sync = follow_state(), sync()
    if not leads() or not settings.get("ask") or room_sync is None:
        return
    keys = [answers_key(mine.code, number) for number in (settings.ask, settings.get("ask_first", 0)) if number]
    for key in keys:
        room_sync.tally(key)
    room_sync.settle(timeout=SEND_WAIT_SECONDS)  # a read that started after the click
    tallies = [room_sync.tally(key) for key in keys]
    if None in tallies:
        mine.ask_message = ("ask_store_down", {"error": room_sync.error or ""})
        return
    if len(tallies) == 2:  # a vote again: who moved from which choice, of those who voted both times
        settings.ask_moves = moves_text(moves_of(tallies[1], tallies[0], len(LETTERS)))
    settings.ask_tally, settings.ask_phase = tally_text(counts_of(tallies[0])), "shown"


def hide_token(token: int) -> None:
    if leads() and settings.get("ask"):
        hidden = (ids_of(settings.get("ask_hide", "")) or frozenset()) | {token}
        settings.ask_hide = ",".join(map(str, sorted(hidden)))


def end_round() -> None:
    for name, value in ENDED.items():
        settings[name] = value
    follow_state().ask_at = None

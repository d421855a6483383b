"""A leader's move reaches the followers on its own server at once: the leader's publish asks each of this
server's sessions following the room to run its page now, instead of each waiting for its next poll. A session
whose step fragment is known is asked to run that fragment alone (`ui.follow.page.take_step`: a move of the step,
the teacher's most frequent, is applied there; any other change hands over to a run of the whole page): 30
followers then cost the server 30 runs of the step, not 30 runs of the page with its sidebar.

Streamlit has no public call for one session to start another's run: `ui.host.streamlit_internals.ask_to_run` asks
the session as Streamlit's own "run on save" does, and tests/test_follow_browser.py checks that followers move with
polls slowed right down. Followers on another server (rooms shared through Redis) still learn of a move by polling.
"""

from __future__ import annotations

import threading

from ui.host import streamlit_internals

_lock = threading.Lock()
_following: dict[str, set[str]] = {}  # room code → ids of this server's sessions following it
_step_fragments: dict[str, str] = {}  # session id → the id of the fragment that draws its step


def listen(code: str | None) -> None:
    """The session now running follows room `code` (None: no room)."""
    session_id = streamlit_internals.current_session_id()
    if session_id is None:
        return
    with _lock:
        for sessions in _following.values():
            sessions.discard(session_id)
        if code:
            _following.setdefault(code, set()).add(session_id)
        for empty in [room for room, sessions in _following.items() if not sessions]:
            del _following[empty]


def listen_step(fragment_id: str | None) -> None:
    """The session now running draws its step in the fragment `fragment_id` (None: unknown; its page is run)."""
    session_id = streamlit_internals.current_session_id()
    if session_id is None:
        return
    with _lock:
        if fragment_id:
            _step_fragments[session_id] = fragment_id
        else:
            _step_fragments.pop(session_id, None)


def listeners(code: str) -> int:
    with _lock:
        return len(_following.get(code, ()))


def notify(code: str) -> int:
    """Ask this server's sessions following `code` to run their page now (a session gone is forgotten).
    Returns how many were asked."""
    with _lock:
        session_ids = list(_following.get(code, ()))
    if not session_ids or not streamlit_internals.can_ask_sessions():  # AppTest's runtime: polls only
        return 0
    asked = 0
    for session_id in session_ids:
        with _lock:
            fragment_id = _step_fragments.get(session_id)
        answer = streamlit_internals.ask_to_run(session_id, fragment_id)
        if answer is False:  # gone
            with _lock:
                _following.get(code, set()).discard(session_id)
                _step_fragments.pop(session_id, None)
        asked += answer is True
    return asked

"""A leader's move reaches the followers on its own server at once: the leader's publish asks each of this
server's sessions following the room to run its page now, instead of each waiting for its next poll. A session
whose step fragment is known is asked to run that fragment alone (`ui.follow.page.take_step`: a move of the step,
the teacher's most frequent, is applied there; any other change hands over to a run of the whole page): 30
followers then cost the server 30 runs of the step, not 30 runs of the page with its sidebar.

Streamlit has no public call for one session to start another's run. This asks the session as Streamlit's own
"run on save" does (`AppSession.request_rerun` with the session's last client state, on the server's event loop):
Streamlit is pinned (requirements.txt), and tests/test_follow_browser.py checks that followers move with polls
slowed right down. Followers on another server (rooms shared through Redis) still learn of a move by polling.
"""

from __future__ import annotations

import logging
import threading

from streamlit.proto.ClientState_pb2 import ClientState
from streamlit.runtime import Runtime
from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx

log = logging.getLogger(__name__)
_lock = threading.Lock()
_following: dict[str, set[str]] = {}  # room code → ids of this server's sessions following it
_step_fragments: dict[str, str] = {}  # session id → the id of the fragment that draws its step


def listen(code: str | None) -> None:
    """The session now running follows room `code` (None: no room)."""
    ctx = get_script_run_ctx()
    if ctx is None:
        return
    with _lock:
        for sessions in _following.values():
            sessions.discard(ctx.session_id)
        if code:
            _following.setdefault(code, set()).add(ctx.session_id)
        for empty in [room for room, sessions in _following.items() if not sessions]:
            del _following[empty]


def listen_step(fragment_id: str | None) -> None:
    """The session now running draws its step in the fragment `fragment_id` (None: unknown; its page is run)."""
    ctx = get_script_run_ctx()
    if ctx is None:
        return
    with _lock:
        if fragment_id:
            _step_fragments[ctx.session_id] = fragment_id
        else:
            _step_fragments.pop(ctx.session_id, None)


def listeners(code: str) -> int:
    with _lock:
        return len(_following.get(code, ()))


def notify(code: str) -> int:
    """Ask this server's sessions following `code` to run their page now (a session gone is forgotten).
    Returns how many were asked."""
    with _lock:
        session_ids = list(_following.get(code, ()))
    if not session_ids or not Runtime.exists():
        return 0
    sessions = getattr(Runtime.instance(), "_session_mgr", None)  # see the module's docstring
    if not hasattr(sessions, "get_active_session_info"):  # a runtime without sessions (AppTest's): polls only
        return 0
    asked = 0
    for session_id in session_ids:
        info = sessions.get_active_session_info(session_id)
        if info is None:
            with _lock:
                _following.get(code, set()).discard(session_id)
                _step_fragments.pop(session_id, None)
            continue
        with _lock:
            fragment_id = _step_fragments.get(session_id)
        try:
            info.session._event_loop.call_soon_threadsafe(_run_page, info.session, fragment_id)  # noqa: SLF001
            asked += 1
        except RuntimeError:  # the server is shutting down
            log.debug("a follower's session could not be asked to run", exc_info=True)
    return asked


def _run_page(session, fragment_id: str | None = None) -> None:
    """On the event loop: a run of the step's fragment `fragment_id` (when the session still holds it) or of the
    whole page, with the session's last widget states and link."""
    state = ClientState()
    state.CopyFrom(session._client_state)  # noqa: SLF001
    state.fragment_id = fragment_id if fragment_id and session.has_fragment(fragment_id) else ""
    state.is_auto_rerun = False
    session.request_rerun(state)

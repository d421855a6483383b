"""The private Streamlit internals kvscope relies on, in one place (Streamlit 1.67, pinned in requirements.txt).

Streamlit has no public call for these: which session and fragment are running, the link a request came with,
asking another session to run its page (as its own "run on save" does), forgetting the sessions of tabs closed long
ago, and running a whole page when a press comes from a fragment this server never drew.
tests/test_streamlit_internals.py fails if the pinned version's shapes change; each call here is a no-op where they
are missing (AppTest's runtime).
"""

from __future__ import annotations

import logging

from streamlit.proto.ClientState_pb2 import ClientState
from streamlit.runtime import Runtime
from streamlit.runtime.app_session import AppSession
from streamlit.runtime.scriptrunner_utils import script_run_context

log = logging.getLogger(__name__)


def current_session_id() -> str | None:
    """The id of the browser session whose script runs on this thread (None outside a script run)."""
    ctx = script_run_context.get_script_run_ctx()
    return None if ctx is None else ctx.session_id


def request_link() -> str | None:
    """The query string of the browser's link when it sent the request this run answers (None outside a script
    run). The browser writes a page's new link into its address after the widgets that draw drew theirs: a request
    sent with an older link was sent before the browser had the last draw's widget values."""
    ctx = script_run_context.get_script_run_ctx()
    return None if ctx is None else ctx.query_string


def current_fragment_id() -> str | None:
    """The id of the fragment running now (None: the whole page, or outside a script run)."""
    thread_state = getattr(script_run_context, "ThreadState", None)
    return getattr(thread_state.get(), "fragment_id", None) if thread_state is not None else None


def _session_manager():
    """The runtime's session manager, or None (no server: a script)."""
    return getattr(Runtime.instance(), "_session_mgr", None) if Runtime.exists() else None


def _sessions():
    """The session manager, where it can find a session by its id (AppTest's runtime cannot), else None."""
    manager = _session_manager()
    return manager if hasattr(manager, "get_active_session_info") else None


def can_ask_sessions() -> bool:
    """Whether this process serves browser sessions that `ask_to_run` can reach."""
    return _sessions() is not None


def ask_to_run(session_id: str, fragment_id: str | None = None) -> bool | None:
    """Ask session `session_id` to run the fragment `fragment_id` (when it still holds it) or its whole page, with
    its last widget states and link, on the server's event loop. True: asked; False: the session is gone; None:
    it could not be asked (no server, or one shutting down)."""
    sessions = _sessions()
    if sessions is None:
        return None
    info = sessions.get_active_session_info(session_id)
    if info is None:
        return False
    try:
        info.session._event_loop.call_soon_threadsafe(_run, info.session, fragment_id)  # noqa: SLF001
    except RuntimeError:  # the server is shutting down
        log.debug("a session could not be asked to run", exc_info=True)
        return None
    return True


def _run(session: AppSession, fragment_id: str | None) -> None:
    state = ClientState()
    state.CopyFrom(session._client_state)  # noqa: SLF001
    state.fragment_id = fragment_id if fragment_id and session.has_fragment(fragment_id) else ""
    state.is_auto_rerun = False
    session.request_rerun(state)


def forget_closed_sessions() -> int:
    """Drop the sessions of tabs closed longer ago than Streamlit keeps them for a reconnect
    (`server.disconnectedSessionTTL`). Streamlit keeps them in a TTL cache that only forgets an expired entry when
    it is next written, which a server whose class has left never does: each kept session holds its page's run.
    Returns how many were forgotten."""
    cache = getattr(getattr(_session_manager(), "_session_storage", None), "_cache", None)
    if not callable(getattr(cache, "expire", None)):
        return 0
    return len(cache.expire() or ())


_request_rerun = AppSession.request_rerun


def _rerun_unknown_fragments_whole(self: AppSession, client_state) -> None:
    if client_state is not None and client_state.fragment_id and not self.has_fragment(client_state.fragment_id):
        client_state.fragment_id = ""  # not drawn by this server: a run of the whole page
    _request_rerun(self, client_state)


def run_unknown_fragments_whole() -> None:
    """A press on a page whose server restarted: Streamlit drops a fragment's rerun that the server does not know
    (`AppSession.request_rerun` logs "The fragment … does not exist anymore" and returns), so a step button inside
    the step's fragment would do nothing on a page a new server has not drawn yet. From this call on, such a rerun
    runs the whole page instead, with the same widget states: the page rebuilds its session from the link and the
    press still counts (`ui.page.step.step_buttons`). Once per process, before any page connects (serve.py);
    idempotent."""
    AppSession.request_rerun = _rerun_unknown_fragments_whole

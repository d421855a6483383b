"""A press on a page whose server restarted: Streamlit drops a fragment's rerun that the server does not know
(`AppSession.request_rerun` logs "The fragment … does not exist anymore" and returns), so a step button inside the
step's fragment would do nothing on a page a new server has not drawn yet. Here such a rerun runs the whole page
instead, with the same widget states: the page rebuilds its session from the link and the press still counts
(`ui.step.step_buttons`). Streamlit is pinned (requirements.txt); tests/test_browser.py's restart test guards this.
"""

from __future__ import annotations

from streamlit.runtime.app_session import AppSession

_request_rerun = AppSession.request_rerun


def _rerun_unknown_fragments_whole(self: AppSession, client_state) -> None:
    if client_state is not None and client_state.fragment_id and not self.has_fragment(client_state.fragment_id):
        client_state.fragment_id = ""  # not drawn by this server: a run of the whole page
    _request_rerun(self, client_state)


def install() -> None:
    """Once per process (idempotent)."""
    AppSession.request_rerun = _rerun_unknown_fragments_whole

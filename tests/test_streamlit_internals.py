"""The pinned Streamlit's private internals behave as `ui.host.streamlit_internals` relies on: on a real Runtime with a
real session (no browser), and in AppTest's script runs. A Streamlit upgrade that changes their shape fails here,
not silently on a class's followers."""

import asyncio
import threading

import pytest
from streamlit.proto.ClientState_pb2 import ClientState
from streamlit.runtime import Runtime, RuntimeConfig
from streamlit.runtime.app_session import AppSession
from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage
from streamlit.runtime.memory_session_storage import MemorySessionStorage
from streamlit.runtime.memory_uploaded_file_manager import MemoryUploadedFileManager
from streamlit.testing.v1 import AppTest

from ui.host import streamlit_internals


class Client:
    """A browser session's end of the socket: what the server sends is dropped."""

    def write_forward_msg(self, msg) -> None:
        pass


class Server:
    """A Streamlit Runtime on its own event loop thread, as `streamlit run` makes one, with closed tabs' sessions
    kept for no time at all."""

    def __init__(self, script):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runtime = Runtime(
            RuntimeConfig(
                script_path=str(script),
                media_file_storage=MemoryMediaFileStorage("/media"),
                uploaded_file_manager=MemoryUploadedFileManager("/upload"),
                session_storage=MemorySessionStorage(ttl_seconds=0),
            )
        )
        self.on_loop(self.runtime.start())

    def on_loop(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30)

    def call(self, function, *args):
        async def called():
            return function(*args)

        return self.on_loop(called())

    def connect(self) -> str:
        return self.call(lambda: self.runtime.connect_session(client=Client(), user_info={}))

    def stop(self) -> None:
        self.runtime.stop()

        async def stopped():
            await self.runtime.stopped

        self.on_loop(stopped())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


@pytest.fixture
def server(tmp_path, monkeypatch):
    monkeypatch.setattr(Runtime, "_instance", None)  # this test's runtime, then whatever was there before
    (tmp_path / "page.py").write_text("")
    server = Server(tmp_path / "page.py")
    yield server
    server.stop()


@pytest.fixture
def reruns(monkeypatch):
    """The client states sessions were asked to run with (the run itself is not needed here)."""
    asked = []
    monkeypatch.setattr(AppSession, "request_rerun", lambda session, state: asked.append((session.id, state)))
    return asked


def test_a_session_is_asked_to_run_its_page_with_its_last_link(server, reruns):
    session_id = server.connect()
    session = server.runtime._session_mgr.get_active_session_info(session_id).session
    session._client_state.query_string = "follow=abc&step=3"  # what its browser last sent
    assert streamlit_internals.can_ask_sessions()
    assert streamlit_internals.ask_to_run(session_id, "a fragment it does not hold") is True
    server.call(lambda: None)  # the loop ran what was asked before this
    assert [(asked_id, state.query_string, state.fragment_id, state.is_auto_rerun) for asked_id, state in reruns] == [
        (session_id, "follow=abc&step=3", "", False)
    ]


def test_a_session_gone_is_said_to_be_gone(server, reruns):
    assert streamlit_internals.ask_to_run("no such session") is False
    assert reruns == []


def test_a_closed_tabs_session_is_forgotten_once_its_reconnect_time_is_over(server):
    session_id = server.connect()
    assert streamlit_internals.forget_closed_sessions() == 0  # open: kept
    server.call(server.runtime.disconnect_session, session_id)  # kept for a reconnect (here: no time at all)
    assert streamlit_internals.forget_closed_sessions() == 1
    assert server.runtime._session_mgr.get_session_info(session_id) is None


def test_a_rerun_of_a_fragment_the_server_never_drew_runs_the_whole_page(server, monkeypatch):
    session_id = server.connect()
    session = server.runtime._session_mgr.get_active_session_info(session_id).session
    asked = []
    monkeypatch.setattr(AppSession, "request_rerun", AppSession.request_rerun)  # put back after the test
    monkeypatch.setattr(streamlit_internals, "_request_rerun", lambda s, state: asked.append(state.fragment_id))
    streamlit_internals.run_unknown_fragments_whole()
    session.request_rerun(ClientState(fragment_id="drawn by the server before its restart"))
    assert asked == [""]


def test_no_server_no_sessions_to_ask(monkeypatch):
    monkeypatch.setattr(Runtime, "_instance", None)
    assert not streamlit_internals.can_ask_sessions()
    assert streamlit_internals.ask_to_run("any") is None
    assert streamlit_internals.forget_closed_sessions() == 0


def page_naming_its_session_and_fragment():
    import streamlit as st

    from ui.host import streamlit_internals

    st.text(f"page: {streamlit_internals.current_fragment_id()}")
    st.text(f"link: {streamlit_internals.request_link()}")

    @st.fragment
    def step():
        st.text(f"fragment: {streamlit_internals.current_fragment_id()}")
        st.text(f"session: {streamlit_internals.current_session_id()}")

    step()


def test_a_script_run_knows_its_session_the_fragment_it_is_in_and_its_requests_link():
    at = AppTest.from_function(page_naming_its_session_and_fragment)
    at.query_params["chapter"] = "10"
    page, link, fragment, session = (text.value for text in at.run().text)
    assert page == "page: None" and link == "link: chapter=10"
    assert fragment.startswith("fragment: ") and fragment != "fragment: None"
    assert session.startswith("session: ") and session != "session: None"
    assert streamlit_internals.current_session_id() is None  # outside a script run

"""What a session keeps between its runs: its typed state (ui/state/session.py), where a one-shot field is read once,
and the link, of which Streamlit keeps a copy."""

import pytest
import streamlit as st

from ui.page import page_state
from ui.state import session
from ui.state.link import AppState, Problem, to_query
from ui.state.session import LessonSession, PageSession, page_controls, settings, view_controls


def test_the_controls_keep_each_kind_under_its_prefix_and_refuse_a_name_not_theirs(monkeypatch):
    """A link setting is an `AppState` field under w_, the page's own control one of its two under p_; a view's own
    control takes any name under v_. A misspelt setting is an error, not a new widget key nobody reads."""
    state = {}
    monkeypatch.setattr(session.st, "session_state", state)
    settings.lang, settings["model"], page_controls.pace, view_controls.keep = "zh", "x", 1.2, 3
    written = {"lang": "zh", "model": "x"}  # the settings the page set since it last drew, and only those
    assert state == {"w_lang": "zh", "w_model": "x", "p_pace": 1.2, "v_keep": 3, "written:w_": written}
    assert settings.values() == written and "chat" not in settings and settings.written() == written
    settings.forget_written()
    assert settings.written() == {} and settings.lang == "zh"
    for controls, name in ((settings, "step"), (settings, "langauge"), (page_controls, "lang")):
        with pytest.raises(KeyError):
            controls.key(name)


def test_take_returns_a_field_and_puts_its_default_back():
    lesson = LessonSession(pending_case="edit_middle", forget_published=True, chat_before_case=True)
    assert lesson.take("pending_case") == "edit_middle" and lesson.pending_case is None
    assert lesson.take("forget_published") is True and lesson.forget_published is False
    assert lesson.take("chat_before_case") is True and lesson.chat_before_case is None
    assert lesson.take("pending_case") is None  # read once: a second read finds the default


def test_take_gives_a_list_field_a_new_empty_list():
    page = PageSession()
    problem = Problem("chat", "1", "0", "no_chat_template")
    page.problems.append(problem)
    taken = page.take("problems")
    assert taken == [problem] and page.problems == []
    page.problems.append(problem)  # the new list is the session's own, not the one handed out
    assert taken == [problem]


def test_a_draw_sends_its_link_even_when_streamlits_copy_already_holds_it(monkeypatch):
    """Streamlit's copy of the link is shared by a session's runs. A run stopped for a newer one can write it after
    the newer run read the browser's link, and be stopped inside the send: the newer run then finds the copy holding
    the very link it draws, while the browser never got it (seen twice in CI: a teacher's link a step behind its
    screen until the next move). So the draw sends its link whatever the copy says."""
    sent = []

    class Copy(dict):  # st.query_params as that newer run finds it
        def to_dict(self):
            return dict(self)

        def from_dict(self, query):
            sent.append(dict(query))
            self.clear()
            self.update(query)

    state = AppState(step=2)
    monkeypatch.setattr(st, "query_params", Copy(to_query(state)))
    page_state.write_link(state)
    assert sent == [to_query(state)]

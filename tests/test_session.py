"""The session's typed state (ui/session.py): a one-shot field is read once."""

from ui.session import LessonSession, PageSession
from ui.state import Problem


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

"""Views read the page's state and never write it: what a view draws follows from the state the page and the
step set before it. The layer and head pickers open on a focused head, set by the step before any view draws."""

import ast
from pathlib import Path

import pytest

from tests.app_helpers import assert_clean, start
from tests.runs import decode
from ui.state.link import default_prompt, language_defaults, parse_query
from ui.views import MODULES
from ui.views.widgets import HEAD_VIEWS
from viz.attention import focused_head

VIEWS_DIR = Path(__file__).resolve().parent.parent / "ui" / "views"
WRITING_METHODS = {"pop", "setdefault", "update", "clear", "popitem", "__setitem__", "__delitem__", "__setattr__",
                   "__delattr__"}


def session_state_writes(source: str) -> list[str]:
    """Where `source` writes Streamlit's session state: an assignment to (or `del` of) one of its keys or
    attributes, a call of a method that changes it, or a second name for it (which would hide the rest)."""
    def is_state(node) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "session_state" or \
            isinstance(node, ast.Name) and node.id == "session_state"

    found = []
    for node in ast.walk(ast.parse(source)):
        targets = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            for part in ast.walk(target):
                if isinstance(part, (ast.Subscript, ast.Attribute)) and is_state(part.value):
                    found.append(f"line {node.lineno}: writes {ast.unparse(part)}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_state(node.func.value) \
                and node.func.attr in WRITING_METHODS:
            found.append(f"line {node.lineno}: {ast.unparse(node.func)}()")
        if isinstance(node, (ast.Assign, ast.NamedExpr, ast.AnnAssign)) and node.value is not None \
                and is_state(node.value):
            found.append(f"line {node.lineno}: a second name for session_state")
    return found


@pytest.mark.parametrize("write", [
    'st.session_state["x"] = 1', "st.session_state.x = 1", "st.session_state.x += 1", "del st.session_state.x",
    'del st.session_state["x"]', 'st.session_state.pop("x")', "st.session_state.setdefault('x', 1)",
    "st.session_state.update(x=1)", "b = lambda: st.session_state.update(x=1)", "ss = st.session_state",
    "st.session_state.a, st.session_state.b = 1, 2",
])
def test_the_check_finds_each_way_of_writing_session_state(write):
    assert session_state_writes(f"import streamlit as st\n{write}\n")


def test_the_check_lets_reads_pass():
    reads = 'x = st.session_state.get("x", 0)\ny = st.session_state["y"]\nz = "z" in st.session_state\n'
    assert session_state_writes("import streamlit as st\n" + reads) == []


@pytest.mark.parametrize("path", sorted(VIEWS_DIR.glob("*.py")), ids=lambda path: path.name)
def test_no_view_writes_session_state(path):
    assert session_state_writes(path.read_text(encoding="utf-8")) == []


WIDGET_PREFIXES = ("w_", "b_", "x_")  # a widget's key says what it is: a setting, a button, an expander
TYPED_STATE = ("page_session", "lesson_session", "follow_state", "ui.state.session", "room_link")  # ui/state/session.py's


@pytest.mark.parametrize("path", sorted(VIEWS_DIR.glob("*.py")), ids=lambda path: path.name)
def test_no_view_reaches_the_sessions_typed_state(path):
    """What a view shows comes in its `ViewContext`: no view fetches the session's typed state (whose fields the
    check above cannot see being written)."""
    source = path.read_text(encoding="utf-8")
    assert [name for name in TYPED_STATE if name in source] == []


def test_the_session_holds_its_widgets_and_three_typed_states(embedded_model):
    """Besides its widgets' keys, a session keeps one dataclass per concern (ui/state/session.py): a step, a view, a
    chapter with an article's case and a move back out of the lesson leave no other key behind."""
    at = start(step=2, view="attention")
    at.button(key="b_next").click().run()
    at.radio(key="w_view").set_value("kv").run()
    at = start(chapter=4)  # a new session, in the lesson
    at.button(key="b_chapter_next").click().run()
    at.button(key="b_chapter_back").click().run()
    assert_clean(at)
    left = {key for key in at.session_state if not key.startswith(WIDGET_PREFIXES)}
    assert left == {"page", "lesson", "follow"}, sorted(left)


def test_head_views_are_the_views_that_draw_the_layer_and_head_pickers():
    drawing = {view for view, module in MODULES.items()
               if "layer_head_pickers(" in (VIEWS_DIR / f"{module}.py").read_text(encoding="utf-8")}
    assert drawing == HEAD_VIEWS


def test_the_pickers_open_on_a_focused_head_and_other_views_leave_the_link_without_one(embedded_model):
    """A page whose link names no layer or head opens the attention view's pickers on the head `focused_head`
    finds in the prefill's attention (the engine's own, from a run of our own); a view without pickers puts no
    layer or head in the link."""
    at = start(view="costs", step=1)
    assert_clean(at)
    assert "layer" not in at.query_params and "head" not in at.query_params
    at = start(view="attention", step=1)
    assert_clean(at)
    _, traces = decode(embedded_model, default_prompt("en"), 0, chat=language_defaults("en").chat)
    expected = focused_head(traces[0].attention[:, :, -1].float().numpy())
    assert expected != (0, 0)  # else the test could not tell a focused head from the default one
    assert (at.number_input(key="w_layer").value, at.number_input(key="w_head").value) == expected
    link, _ = parse_query(dict(at.query_params))
    assert (link.layer, link.head) == expected

"""Views read only their context, and one module owns the session's state.

- Streamlit's session state is touched by `ui/state/session.py` alone: every widget key goes through its `Controls`
  (`settings`, `page_controls`, `view_controls`) and every kept object through `kept`.
- A view (and the lesson, which draws beside it) reads the run only through `ctx.runner`'s `RunView`: each quantity
  named, none of them the model, config, session, store or run behind it, and `Runner` provides every one.
- Views import nothing of the page, the session or the runs' owners: a press reaches the page as the context's
  callback (`ViewContext.load_case`, `ViewContext.measure_again`)."""

import ast
import re
from pathlib import Path

import pytest

from ui.runs.runner import Runner
from ui.views.context import RunView

ROOT = Path(__file__).resolve().parent.parent
UI = sorted((ROOT / "ui").rglob("*.py"))
OWNER = ROOT / "ui" / "state" / "session.py"
READERS = sorted((ROOT / "ui" / "views").glob("*.py")) + sorted((ROOT / "ui" / "lesson").glob("*.py"))
BEHIND_THE_WINDOW = {"model", "config", "session", "cache", "run", "runs", "lease", "store", "limits", "lock"}
# What a view must not import: the page, the session's typed state, the room's link, the runs' owners.
NOT_FOR_VIEWS = ("ui.page", "ui.state.session", "ui.follow.room_link", "ui.runs.runner", "ui.runs.run", "ui.runs.store")
WIDGET_KEY = re.compile(r"""["'][wpv]_[a-z]""")  # a literal widget key of a setting or a page's or view's control


def session_state_uses(source: str) -> list[str]:
    """Where `source` reaches Streamlit's session state: the attribute, the name, an import of it, or its name
    as a string (`getattr(st, "session_state")`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "session_state"
            or isinstance(node, ast.Name)
            and node.id == "session_state"
            or isinstance(node, ast.Constant)
            and node.value == "session_state"
        ):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.ImportFrom) and any(alias.name == "session_state" for alias in node.names):
            found.append(f"line {node.lineno}: imports session_state")
    return found


@pytest.mark.parametrize(
    "use",
    [
        'st.session_state["x"] = 1',
        "x = st.session_state.get('x')",
        "ss = st.session_state",
        "'x' in st.session_state",
        "from streamlit import session_state as s",
        "getattr(st, 'session_state')",
        "del st.session_state.x",
    ],
)
def test_the_check_finds_each_way_of_reaching_session_state(use):
    assert session_state_uses(f"import streamlit as st\n{use}\n")


def test_the_check_lets_the_rest_of_streamlit_pass():
    assert session_state_uses("import streamlit as st\nst.query_params.get('x')\nst.button('b', key='b_x')\n") == []


@pytest.mark.parametrize("path", [p for p in UI if p != OWNER], ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_session_module_touches_session_state_or_writes_a_widget_key(path):
    source = path.read_text(encoding="utf-8")
    assert session_state_uses(source) == []
    assert WIDGET_KEY.findall(source) == [], "a widget key written out: ask ui.state.session's Controls for it"


def runner_reads(source: str) -> set[str]:
    """The attributes `source` reads of `ctx.runner`, or of a name bound to it (`runner = ctx.runner`, or in a
    tuple: `info, runner = ctx.info, ctx.runner`)."""
    tree = ast.parse(source)
    is_runner = lambda node: isinstance(node, ast.Attribute) and node.attr == "runner"  # noqa: E731
    pairs = [
        (target, value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        for target in node.targets
        for target, value in (
            zip(target.elts, node.value.elts)
            if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
            else [(target, node.value)]
        )
    ]
    aliases = {target.id for target, value in pairs if isinstance(target, ast.Name) and is_runner(value)}
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and (is_runner(node.value) or isinstance(node.value, ast.Name) and node.value.id in aliases)
    }


def test_the_reads_check_follows_an_alias():
    source = (
        "def f(ctx):\n    a, runner = 1, ctx.runner\n    pool = ctx.runner.pool_state()\n"
        "    return ctx.runner.info, runner.model, pool.blocks\n"
    )
    assert runner_reads(source) == {"info", "model", "pool_state"}


def window() -> set[str]:
    return {name for name in dir(RunView) if not name.startswith("_")} | set(RunView.__annotations__)


@pytest.mark.parametrize("path", READERS, ids=lambda p: str(p.relative_to(ROOT)))
def test_views_and_the_lesson_read_the_run_only_through_its_window(path):
    assert runner_reads(path.read_text(encoding="utf-8")) - window() == set()


def test_the_window_shows_no_model_config_or_run_and_the_runner_opens_it_all():
    assert window() & BEHIND_THE_WINDOW == set()
    attributes = Runner.__init__.__code__.co_names  # those set in __init__ (`self.history = …`)
    assert [name for name in sorted(window()) if not hasattr(Runner, name) and name not in attributes] == []


def imported(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


@pytest.mark.parametrize("path", READERS, ids=lambda p: str(p.relative_to(ROOT)))
def test_views_and_the_lesson_import_nothing_of_the_page_the_session_or_the_runs_owners(path):
    allowed = {"ui.state.session"} if path.name == "context.py" else set()  # the context hands out widget keys
    names = imported(path.read_text(encoding="utf-8"))
    assert [
        n
        for n in sorted(names)
        if n.startswith(NOT_FOR_VIEWS) and n not in allowed and not n.startswith(tuple(f"{a}." for a in allowed))
    ] == []

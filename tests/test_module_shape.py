"""The code's shape: no import circles among engine/, ui/ and viz/; no ui/ module over 350 lines (a newcomer reads
one module at a time)."""

from pathlib import Path

from scripts.import_circles import circles, graph

ROOT = Path(__file__).resolve().parent.parent


def test_no_import_circles():
    assert circles(graph()) == []


def test_the_circle_finder_finds_a_three_module_circle():
    edges = {"ui.a": {"ui.b"}, "ui.b": {"ui.c"}, "ui.c": {"ui.a"}, "ui.d": {"ui"}, "ui": {"ui.d"}}
    assert circles(edges) == [["ui.a", "ui.b", "ui.c"]]  # a package's __init__ and its module are no circle


def test_no_ui_module_is_over_350_lines():
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "ui").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 350}
    assert long == {}

"""The code's shape: no import circles among engine/, ui/ and viz/."""

from scripts.import_circles import circles, graph


def test_no_import_circles():
    assert circles(graph()) == []


def test_the_circle_finder_finds_a_three_module_circle():
    edges = {"ui.a": {"ui.b"}, "ui.b": {"ui.c"}, "ui.c": {"ui.a"}, "ui.d": {"ui"}, "ui": {"ui.d"}}
    assert circles(edges) == [["ui.a", "ui.b", "ui.c"]]  # a package's __init__ and its module are no circle


"""The code's shape: no import circles among engine/, ui/ and viz/; no module of the app over 350 lines as ruff
formats it (a newcomer reads one module at a time, and packing lines past the formatter does not count)."""

import subprocess
import sys
from pathlib import Path

from scripts.import_circles import circles, graph

ROOT = Path(__file__).resolve().parent.parent
APP_CODE = ["engine", "ui", "viz", "app.py", "serve.py"]


def formatted_lines(source: str) -> int:
    """How many lines `source` has once ruff formats it with the repository's ruff.toml."""
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", "module.py", "-"],
        input=source,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return len(done.stdout.splitlines())


def test_no_import_circles():
    assert circles(graph()) == []


def test_the_circle_finder_finds_a_three_module_circle():
    edges = {"ui.a": {"ui.b"}, "ui.b": {"ui.c"}, "ui.c": {"ui.a"}, "ui.d": {"ui"}, "ui": {"ui.d"}}
    assert circles(edges) == [["ui.a", "ui.b", "ui.c"]]  # a package's __init__ and its module are no circle


def test_formatted_lines_counts_what_the_formatter_unpacks():
    names = ", ".join(f"argument_{n}: int" for n in range(8))
    packed = f"def f({names}): pass\n"  # 109 columns: within the limit, yet packed
    assert len(packed.splitlines()) == 1
    assert formatted_lines(packed) > 2  # one argument a line, then the body


def test_no_module_of_the_app_is_over_350_formatted_lines():
    modules = [
        p for name in APP_CODE for p in ((ROOT / name).rglob("*.py") if (ROOT / name).is_dir() else [ROOT / name])
    ]
    assert len(modules) > 100  # the walk found the code
    long = {str(p.relative_to(ROOT)): n for p in modules if (n := formatted_lines(p.read_text())) > 350}
    assert long == {}

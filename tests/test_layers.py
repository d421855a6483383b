"""ui/ by concept: every module in a package, the packages in layers, and no import running back up a layer
(each counted as scripts/import_circles.py counts them: under TYPE_CHECKING and inside functions too).
docs/architecture.md draws the same graph."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import import_circles  # noqa: E402

# Lowest first: a package imports only from its own layer's package and those before it.
LAYERS = ("ui.text", "ui.state", "ui.host", "ui.runs", "ui.follow", "ui.views", "ui.lesson", "ui.page")


def package(module: str) -> str | None:
    """The ui package a module belongs to (None outside ui/); a module directly in ui/ is its own."""
    parts = module.split(".")
    return None if parts[0] != "ui" else ".".join(parts[:2])


def upward_arrows(graph: dict[str, set[str]]) -> list[str]:
    rank = {name: i for i, name in enumerate(LAYERS)}
    return sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if package(module) in rank
        for target in targets
        if package(target) in rank and rank[package(target)] > rank[package(module)]
    )


def test_every_ui_module_is_in_a_package_of_the_layers():
    loose = [p.name for p in (ROOT / "ui").glob("*.py") if p.name != "__init__.py"]
    packages = sorted(f"ui.{p.name}" for p in (ROOT / "ui").iterdir() if (p / "__init__.py").exists())
    assert loose == [] and packages == sorted(LAYERS)


def test_no_import_runs_back_up_a_layer():
    assert upward_arrows(import_circles.graph()) == []


def test_the_check_finds_an_arrow_up():
    assert upward_arrows({"ui.runs.runner": {"ui.page.step"}, "ui.page.step": {"ui.runs.runner"}}) == [
        "ui.runs.runner -> ui.page.step"
    ]


def test_the_link_counts_the_lessons_chapters():
    """The link's chapter bound is counted in lesson.toml (the link sits below the lesson's code)."""
    from ui.lesson.chapters import CHAPTERS
    from ui.state.link import CHAPTER_COUNT, RANGES

    assert CHAPTER_COUNT == len(CHAPTERS) == RANGES["chapter"][2]

"""README's table of the views says which lesson chapters each view teaches: the lesson (`ui/lesson/lesson.toml`) is the
source, and this checks the table against it, so the two cannot drift apart."""

from pathlib import Path

from ui.lesson.chapters import CHAPTERS
from ui.state.link import VIEWS
from ui.text import strings

README = Path(__file__).resolve().parent.parent / "README.md"
HEADER = "| view | what it shows | lesson chapters |"


def chapters_written(cell: str) -> list[int]:
    """ "1–5" → [1, 2, 3, 4, 5]; "8, 9, 15" → [8, 9, 15]; "—" (a view no chapter shows) → []."""
    numbers = []
    for part in [] if cell == "—" else cell.split(","):
        low, _, high = part.strip().partition("–")
        numbers += range(int(low), int(high or low) + 1)
    return numbers


def readme_table() -> dict[str, list[int]]:
    lines = README.read_text(encoding="utf-8").splitlines()
    start = lines.index(HEADER) + 2  # past the header and its rule
    table = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        title, _, chapters = [cell.strip() for cell in line.strip("|").split("|")]
        table[title] = chapters_written(chapters)
    return table


def test_chapters_written():
    assert chapters_written("1–5") == [1, 2, 3, 4, 5]
    assert chapters_written("8, 9, 15") == [8, 9, 15]
    assert chapters_written("12–13") == [12, 13]
    assert chapters_written("—") == []


def test_readmes_views_table_names_each_views_chapters():
    lesson = {strings.t("view_" + view): [c.number for c in CHAPTERS if c.view == view] for view in VIEWS}
    assert readme_table() == lesson

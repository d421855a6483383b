"""docs/teaching.md's table of the lesson's chapters says, for each chapter, its title, view, step, teaching points
and the settings it changes: the lesson (`ui/lesson/lesson.toml`) is the source, and this checks the table against
it, so the two cannot drift apart (as tests/test_readme_views.py checks README's table of the views)."""

from pathlib import Path

from ui.lesson.chapters import CHAPTERS, DEFAULT_SETTINGS, Chapter
from ui.text import strings

TEACHING = Path(__file__).resolve().parent.parent / "docs" / "teaching.md"
HEADER = "| # | chapter | view | step | points | what it sets |"
CASES = {"case1": "the article's Case 1", "case2": "the article's Case 2"}


def settings_written(chapter: Chapter) -> str:
    """The table's "what it sets" cell: the settings the chapter changes from the link's defaults, in words."""
    settings = chapter.settings
    parts = []
    if settings["block_size"] != DEFAULT_SETTINGS["block_size"]:
        parts.append(f"blocks of {settings['block_size']}")
    if settings["kv_splits"] != DEFAULT_SETTINGS["kv_splits"]:
        parts.append(f"{settings['kv_splits']} KV splits")
    if settings["pool"] == "busy":
        parts.append("a busy pool")
    if chapter.view == "serving":  # the Serving view's own pool, whether or not the chapter changes it
        parts.append(f"a pool of {settings['serve_blocks']} blocks, at most {settings['serve_seqs']} requests a step")
    if chapter.view == "speculate":  # the speculative view's draft and prompt, whether or not the chapter changes them
        draft = {"lookup": "prompt lookup", "early_exit": f"early exit at layer {settings['draft_n']}"}[
            settings["draft"]
        ]
        prompt = {"edit": "a code edit", "free": "a free answer", "page": "the page's prompt"}[settings["spec_prompt"]]
        parts.append(f"{draft}, k = {settings['draft_k']}, on {prompt}")
    if chapter.case:
        parts.append(CASES[chapter.case])
    if chapter.window_prompt:
        parts.append("its own long prompt on a model with a sliding window")
    return "; ".join(parts) or "—"


def lesson_rows() -> list[tuple[str, ...]]:
    return [
        (
            str(c.number),
            c.part("title", "en"),
            strings.t("view_" + c.view),
            str(c.step),
            ", ".join(c.points),
            settings_written(c),
        )
        for c in CHAPTERS
    ]


def teaching_rows() -> list[tuple[str, ...]]:
    lines = TEACHING.read_text(encoding="utf-8").splitlines()
    start = lines.index(HEADER) + 2  # past the header and its rule
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append(tuple(cell.strip() for cell in line.strip().strip("|").split("|")))
    return rows


def test_settings_written():
    by_key = {c.key: c for c in CHAPTERS}
    assert settings_written(by_key["tokens"]) == "—"
    assert settings_written(by_key["paging"]) == "blocks of 4; a busy pool"
    assert settings_written(by_key["split_kv"]) == "4 KV splits"


def test_teachings_chapter_table_is_the_lessons():
    """Every chapter once, in order, with its title, view, step, points and settings as lesson.toml says."""
    written, lesson = teaching_rows(), lesson_rows()
    assert [row[0] for row in written] == [row[0] for row in lesson]  # each chapter once, in order
    for row, expected in zip(written, lesson):
        assert row == expected, f"docs/teaching.md's row for chapter {expected[0]}"

"""The teacher's page on a projector (1280×720, large text), en and zh: the leader's panel is a collapsed strip in
Streamlit's header bar that clears the title of a free page; opened, it shows the QR code and the link on screen.
In every chapter the strip leaves the figure on the first screen and covers neither the title nor the chapter's
buttons: the teacher's lesson walks check it (tests/test_lesson_walk.py)."""

import pytest

from tests.helpers import box, overlap
from tests.server import settled_text

PROJECTOR = {"width": 1280, "height": 720}  # conftest.py's page


def open_settled(page, url: str) -> None:
    """Open `url` and wait for its step to be drawn: the session's server may load a model first (up to a few
    minutes on a busy 2-core machine), then for the run to settle."""
    page.goto(url)
    page.wait_for_selector(".st-key-generated code", timeout=300_000)
    settled_text(page)


def test_the_opened_panel_shows_the_qr_code_and_the_students_link_on_screen(server, page):
    open_settled(page, f"{server}/?lang=zh&lead=1&chapter=6&large=1")
    page.locator(".st-key-follow-share summary").click()
    page.locator(".kv-follow-qr img").wait_for(state="visible", timeout=30_000)
    for part in (".kv-follow-qr img", ".kv-follow-link a"):
        shown = box(page, part)
        assert shown["height"] > 20 and shown["y"] >= 0, (part, shown)
        assert shown["y"] + shown["height"] <= PROJECTOR["height"], (part, shown)
        assert shown["x"] + shown["width"] <= PROJECTOR["width"], (part, shown)
    assert "follow=" in page.locator(".kv-follow-link a").inner_text()


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_strip_clears_the_title_of_a_leaders_free_page(server, page, lang):
    open_settled(page, f"{server}/?lang={lang}&lead=1&step=3&large=1")
    assert not overlap(box(page, ".st-key-follow-share"), box(page, "h1"))

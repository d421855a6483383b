"""The teacher's page on a projector (1280×720, large text), en and zh: the leader's panel is a collapsed strip in
Streamlit's header bar, so the chapter's figure stays wholly on the first screen as on a student's page, and the
strip covers neither the title nor the chapter's buttons; opened, it shows the QR code and the link on screen."""

import contextlib

import pytest

from tests.server import settled_text
from tests.helpers import box

PROJECTOR = {"width": 1280, "height": 720}


@contextlib.contextmanager
def projector_page(browser):
    """A page in a fresh context (its own Streamlit session) on the projector's screen."""
    context = browser.new_context(viewport=PROJECTOR)
    try:
        yield context.new_page()
    finally:
        context.close()


def open_settled(page, url: str) -> None:
    """Open `url` and wait for its step to be drawn: the session's server may load a model first (up to a few
    minutes on a busy 2-core machine), then for the run to settle."""
    page.goto(url)
    page.wait_for_selector(".st-key-generated code", timeout=300_000)
    settled_text(page)


def overlap(a: dict, b: dict) -> bool:
    return (a["x"] < b["x"] + b["width"] and b["x"] < a["x"] + a["width"]
            and a["y"] < b["y"] + b["height"] and b["y"] < a["y"] + a["height"])


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("chapter", [6, 15])
def test_the_leaders_panel_leaves_the_chapters_figure_on_the_first_screen(server, browser, lang, chapter):
    with projector_page(browser) as page:
        open_settled(page, f"{server}/?lang={lang}&lead=1&chapter={chapter}&large=1")
        assert page.evaluate("window.scrollY") == 0
        strip, figure = box(page, ".st-key-follow-share"), box(page, ".st-key-chapter-figure")
        assert figure["height"] > 100, figure  # the chapter's part was drawn there
        assert figure["y"] >= 0 and figure["y"] + figure["height"] <= PROJECTOR["height"], figure
        assert strip["y"] >= 0 and strip["x"] + strip["width"] <= PROJECTOR["width"], strip  # on screen
        for other in ("h1", ".st-key-b_chapter_next button", ".st-key-b_chapter_back button", ".st-key-b_next button",
                      ".st-key-chapter-figure"):
            assert not overlap(strip, box(page, other)), other


def test_the_opened_panel_shows_the_qr_code_and_the_students_link_on_screen(server, browser):
    with projector_page(browser) as page:
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
def test_the_strip_clears_the_title_of_a_leaders_free_page(server, browser, lang):
    with projector_page(browser) as page:
        open_settled(page, f"{server}/?lang={lang}&lead=1&step=3&large=1")
        assert not overlap(box(page, ".st-key-follow-share"), box(page, "h1"))

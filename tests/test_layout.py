"""Projector-first layout in headless Chromium: at 1280×720 with large text, the Next button and each view's main
figure are on the first screen, in English and Chinese; the header's step counter names the step, its phase and
the input position; on a phone (390×844) Next shows without scrolling sideways.

Needs Debian's chromium and the `playwright` package; `.ci/run` installs both.
"""

import pytest

import engine
from tests.server import settled_text
from ui import strings
from ui.lesson import CHAPTERS
from ui.state import VIEWS, default_prompt, parse_query

pytestmark = pytest.mark.browser

PROJECTOR = {"width": 1280, "height": 720}
PHONE = {"width": 390, "height": 844}
FIGURE_SHOWN = 200  # px of the main figure that must be on the first screen


@pytest.fixture(scope="module")
def projector(browser):
    page = browser.new_page(viewport=PROJECTOR)
    yield page
    page.close()


def box(page, selector: str) -> dict:
    locator = page.locator(selector)
    assert locator.count() == 1, f"{selector}: {locator.count()} on the page"
    found = locator.bounding_box()
    assert found is not None, f"{selector} is not drawn"
    return found


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("view", VIEWS)
def test_next_and_the_main_figure_are_on_the_first_screen_with_large_text(server, projector, view, lang, request):
    projector.goto(f"{server}/?step=8&view={view}&lang={lang}&large=1")
    settled_text(projector)
    assert projector.evaluate("window.scrollY") == 0
    next_button, figure = box(projector, ".st-key-b_next button"), box(projector, ".st-key-main-figure")
    assert next_button["y"] + next_button["height"] <= PROJECTOR["height"], next_button
    assert figure["height"] >= FIGURE_SHOWN, figure
    assert figure["y"] + FIGURE_SHOWN < PROJECTOR["height"], figure
    # A page in Chinese opens on embedded-zh (Gemma 3 270M), one in English on SmolLM2.
    assert_step_counter(projector, lang, request.getfixturevalue("embedded_model" if lang == "en"
                                                                 else "embedded_zh_model"))


def assert_step_counter(page, lang: str, model) -> None:
    """The header at step 8 of the default prompt: "step 8 · decode · position P" with this step's input and
    output named. Step 1 is the prefill of positions 0…n−1; step k ≥ 2 feeds the token at position n + k − 2."""
    chat = parse_query({"lang": lang})[0].chat  # the language's default (off for the Chinese base model)
    prompt_tokens = len(engine.DecodeSession(model, default_prompt(lang), chat=chat).prompt_ids)
    assert page.locator(".kv-counter").inner_text() == strings.t("counter_decode", lang, step=8,
                                                                  position=prompt_tokens + 6)
    header = page.locator(".kv-header").inner_text()
    assert strings.t("io_input", lang) in header and strings.t("io_output", lang) in header


def test_the_phone_shows_title_and_next_without_scrolling_sideways(server, browser):
    page = browser.new_page(viewport=PHONE)
    try:
        page.goto(f"{server}/?step=8&view=attention")
        settled_text(page)
        next_button = box(page, ".st-key-b_next button")
        assert 0 <= next_button["x"] and next_button["x"] + next_button["width"] <= PHONE["width"], next_button
        assert next_button["y"] + next_button["height"] <= PHONE["height"], next_button
        assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
        title, header = box(page, "h1"), box(page, '[data-testid="stHeader"]')
        assert title["y"] >= header["y"] + header["height"], (title, header)  # not under the sidebar's button
    finally:
        page.close()


@pytest.mark.parametrize(("viewport", "lang"), [(PROJECTOR, "en"), (PROJECTOR, "zh"), (PHONE, "en")])
def test_a_banner_under_the_title_leaves_the_title_whole(server, browser, viewport, lang):
    """A link's problem shows as a banner between the title and the step: the banner starts below the title's text
    (Streamlit pulls what follows a title up by its Markdown margin; a banner there covered half the title)."""
    page = browser.new_page(viewport=viewport)
    try:
        page.goto(f"{server}/?step=2&temperature=abc&lang={lang}&large=1")
        settled_text(page)
        title, banner = box(page, "h1"), box(page, '[data-testid="stAlert"]')
        assert banner["y"] >= title["y"] + title["height"], (title, banner)
        header = box(page, ".kv-header")
        assert header["y"] >= banner["y"] + banner["height"], (banner, header)
    finally:
        page.close()


# -- the lesson on a projector ----------------------------------------------------------------------------------

NOT_CUT = """() => [...document.querySelectorAll(
    '.st-key-b_chapter_back button p, .st-key-b_chapter_next button p, [class*="st-key-b_"] button p, h1')]
    .filter(el => el.offsetParent !== null && el.getBoundingClientRect().right > 0)  // not in the closed sidebar
    .filter(el => el.scrollWidth > el.clientWidth + 1).map(el => el.textContent)"""
CHIPS_OUTSIDE = """() => { const box = document.querySelector('.kv-stream-box').getBoundingClientRect();
    return [...document.querySelectorAll('.kv-stream-box .kv-chip')].map(c => c.getBoundingClientRect())
        .filter(c => c.bottom > box.top && c.top < box.bottom)  // the chips scrolled into the box's view
        .filter(c => c.left < box.left - 1 || c.right > box.right + 1).length; }"""


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_every_chapters_figure_is_whole_on_the_first_screen_with_large_text(server, projector, lang, embedded_model):
    """At 1280×720 with large text, each chapter's own figure (container `chapter-figure`) is entirely on the first
    screen with Next and the chapter's title; no button label or title is cut; the token chips stay in their box."""
    for chapter in CHAPTERS:
        projector.goto(f"{server}/?chapter={chapter.number}&lang={lang}&large=1")
        settled_text(projector)
        assert projector.evaluate("window.scrollY") == 0
        figure, title = box(projector, ".st-key-chapter-figure"), box(projector, "h1")
        assert figure["height"] > 100, (chapter.key, figure)  # the chapter's part was drawn there
        assert figure["y"] >= 0 and figure["y"] + figure["height"] <= PROJECTOR["height"], (chapter.key, figure)
        assert chapter.part("title", lang) in projector.locator("h1").inner_text()
        assert title["y"] + title["height"] <= PROJECTOR["height"]
        next_button = box(projector, ".st-key-b_next button")
        assert next_button["y"] + next_button["height"] <= PROJECTOR["height"], (chapter.key, next_button)
        assert projector.evaluate(NOT_CUT) == [], chapter.key
        assert projector.evaluate(CHIPS_OUTSIDE) == 0, chapter.key


def test_a_tapped_token_shows_its_position_id_and_bytes_on_a_touch_screen(server, browser, embedded_model):
    """Touch screens have no hover: a tap on a chip shows its hover text in a bar at the foot of the screen."""
    page = browser.new_page(viewport=PHONE, has_touch=True, is_mobile=True)
    try:
        page.goto(f"{server}/?step=2&view=flow")
        settled_text(page)
        chip = page.locator(".kv-stream-box .kv-tip").last
        chip.tap()
        shown = chip.evaluate("""c => { const after = getComputedStyle(c, '::after');
            return {content: after.content, position: after.position, focused: document.activeElement === c,
                    title: c.getAttribute('title')}; }""")
        assert shown["focused"] and shown["position"] == "fixed", shown
        assert shown["content"] == '"' + shown["title"] + '"', shown  # the tip itself, whole
        assert shown["title"].startswith("position ") and " · id " in shown["title"] and " · bytes " in shown["title"]
    finally:
        page.close()


def test_the_phone_keeps_the_step_buttons_in_one_row(server, browser):
    page = browser.new_page(viewport=PHONE)
    try:
        page.goto(f"{server}/?step=8&view=attention")
        settled_text(page)
        tops = {round(box(page, f".st-key-{key} button")["y"]) for key in ("b_prefill", "b_back", "b_next", "b_reset")}
        assert len(tops) == 1, tops
        assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    finally:
        page.close()

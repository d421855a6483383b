"""The whole lesson walked as a class walks it (issue 34), in headless Chromium at 1280×720 with large text: SmolLM2
in English and Gemma 3 270M in Chinese, each on a student's page and on the teacher's (`lead=1`, the students' panel
in the header). Each walk is one page. A student's: chapter 1 to the last by PageDown, back to 1 by PageUp, then
the KV-cache chapter opened from its link and every chapter after it revisited (PageDown from the two contexts to
eviction, PageUp back to the two contexts). The teacher's: chapter 1
to the last by PageDown, back to the two-contexts chapter by PageUp and forward again to the last. At every chapter:

- its figure (container `chapter-figure`), its title and Next are wholly on the first screen, no button label or
  title is cut and the token chips stay in their box;
- no warning or error is shown (a chapter's own settings are valid for the running model; nobody's link asked for
  anything);
- its text is the same on every visit (the numbers come from the chapter's own run, not from where the class came
  from);
- the chapter's question lists its choices (A, B, …); on the teacher's page, the button that opens the class's vote
  on it is on the first screen, and the leader's strip in the header is on screen and covers neither the title, the
  chapter's buttons, Next nor the figure;
- in Chinese on Gemma, the chapters on tokens, attention, paging and the article's Case 2 show characters and whole
  words in the token stream (never a byte chip or U+FFFD) beside their figure.

On the backward walk of each student's page, → steps after a click on each kind of control the lesson shows: the
whole view's expander and the K/V radio (the KV cache chapter), the layer picker and the scores toggle (the attention
chapter), the batch slider (the long-context chapter) (the view radio is hidden in the lesson: the chapter sets the
view), and PageUp then changes the
chapter. tests/test_controls.py covers the same controls on SmolLM2's free page; these are the lesson's, on both
models.

The session's server (conftest.py); Debian's chromium and the `playwright` package, as tests/test_browser.py.
"""

import pytest
from playwright.sync_api import expect

from engine.characters import REPLACEMENT
from tests.helpers import (
    CHIPS_OUTSIDE,
    NOT_CUT,
    STREAM_CHIPS,
    WAIT_MS,
    box,
    link,
    open_whole_view_in,
    overlap,
    settled_box,
    until_link,
    widget,
)
from tests.server import settled_text
from tests.test_controls import batch_slider, click_then_key, layer_picker, nothing, scores_on, text_on_page
from ui.follow.class_votes import LETTERS
from ui.lesson.chapters import CHAPTERS, number_of
from ui.text import strings
from ui.views import OWN_STEPS

pytestmark = pytest.mark.browser

SCREEN = 720  # the projector's height (conftest.py's page: 1280×720)
LAST = len(CHAPTERS)
# from the two-contexts chapter to the last (eviction): those with runs of their own, or that once changed on a revisit
REVISITED = range(number_of("contexts"), LAST + 1)
# The lesson's problems; not the teacher's strip, which says the test server listens on loopback only (phones could
# not reach it: tests/test_follow_browser.py checks that warning).
SHOWN_PROBLEMS = (
    ':is([data-testid="stAlertContentWarning"], [data-testid="stAlertContentError"]):not(.st-key-follow-lead *)'
)
# model → the page's language (a page in Chinese opens on Gemma 3 270M, one in English on SmolLM2)
MODELS = {"smollm2": "en", "gemma3": "zh"}
# Chapter key → whole words Gemma's tokenizer keeps as one token, each a chip of the Chinese page's stream.
WHOLE_WORDS = {
    "tokens": ["什么是", "缓存"],
    "attention": ["什么是", "缓存"],
    "paging": ["什么是", "缓存"],
    "prefix_case2": ["解释", "什么是", "语言", "模型"],
}
STRIP = ".st-key-follow-share"  # the leader's panel, collapsed in the header
UNDER_STRIP = (
    "h1",
    ".st-key-b_chapter_next button",
    ".st-key-b_chapter_back button",
    ".st-key-b_next button",
    ".st-key-chapter-figure",
)


class Walk:
    """One page walking the lesson: each chapter it arrives at is checked, and its text kept from the first visit."""

    def __init__(self, page, lang: str, lead: bool):
        self.page, self.lang, self.lead = page, lang, lead
        self.first_text: dict[int, str] = {}

    def arrive(self, number: int, same_text: bool = True) -> None:
        """Wait until the page shows chapter `number` and has finished its run; check what it shows (`same_text`:
        and that its text is the one this walk first saw there)."""
        until_link(self.page, chapter=str(number))
        page = self.page
        figure = settled_box(page, ".st-key-chapter-figure")
        assert page.locator("h1").inner_text().startswith(f"{number}/{LAST} · "), number
        assert page.evaluate("document.querySelector('[data-testid=stMain]').scrollTop") == 0, number  # at its top
        assert figure["height"] > 100, (number, figure)  # the chapter's part was drawn there
        assert figure["y"] >= 0 and figure["y"] + figure["height"] <= SCREEN, (number, figure)
        for element in ("h1", ".st-key-b_next button"):  # the title and Next on the first screen too
            assert box(page, element)["y"] + box(page, element)["height"] <= SCREEN, (number, element)
        assert page.evaluate(NOT_CUT) == [], number  # no button label or title cut
        own = CHAPTERS[number - 1].view in OWN_STEPS  # its run's tokens are in its view: no token stream
        assert page.evaluate(CHIPS_OUTSIDE) == (-1 if own else 0), number  # the token chips stay in their box
        assert page.locator(SHOWN_PROBLEMS).all_inner_texts() == [], number
        text = page.locator(".st-key-chapter").inner_text()
        assert text.strip(), number
        assert not same_text or text == self.first_text.setdefault(number, text), number
        choices = len(CHAPTERS[number - 1].choices(self.lang))
        assert all(f"{letter} · " in text for letter in LETTERS[:choices]), number  # the question's choices, A, B…
        if self.lead:
            strip_leaves_room(page, number)
            vote = box(page, ".st-key-b_vote_open")  # the class votes on the question: one press, on screen
            assert vote["y"] + vote["height"] <= SCREEN, number
        key = CHAPTERS[number - 1].key
        if self.lang == "zh" and key in WHOLE_WORDS:
            whole_characters(page, key)

    def key(self, key: str, number: int) -> None:
        self.page.keyboard.press(key)
        self.arrive(number)


@pytest.mark.parametrize("model", MODELS)
def test_a_students_page_walks_the_lesson_forward_back_and_revisited(server, page, model):
    lang = MODELS[model]
    base = f"{server}/?lang={lang}&large=1"
    walk = forward(page, base, lang)
    for number in range(LAST - 1, 0, -1):
        controls_then_arrow(page, number + 1, lang)  # the controls of the chapter just left, before PageUp
        walk.key("PageUp", number)
    page.goto(f"{base}&chapter={REVISITED[0] - 1}")
    walk.arrive(REVISITED[0] - 1, same_text=False)  # a new session: a chapter's text may quote another head
    for number in REVISITED:
        walk.key("PageDown", number)
    for number in reversed(REVISITED[:-1]):
        walk.key("PageUp", number)
    assert "lead" not in link(page)
    assert "model" not in page.url  # each language's model is its default: not written into the link


@pytest.mark.parametrize("model", MODELS)
def test_the_teachers_page_walks_the_lesson_forward_then_back_and_again_through_the_last(server, page, model):
    """Forward to the last chapter, back by PageUp to the two contexts, and forward again to the last: those chapters
    revisited on the teacher's page too (their runs are their own; the class follows every one)."""
    walk = forward(page, f"{server}/?lang={MODELS[model]}&large=1&lead=1", MODELS[model], lead=True)
    for number in range(LAST - 1, REVISITED[0] - 1, -1):
        walk.key("PageUp", number)
    for number in REVISITED[1:]:
        walk.key("PageDown", number)
    assert "lead" in link(page)


def forward(page, base: str, lang: str, lead: bool = False) -> Walk:
    """Chapter 1 opened from its link, then each chapter to the last by PageDown, each checked on arrival."""
    walk = Walk(page, lang, lead)
    page.goto(f"{base}&chapter=1")
    walk.arrive(1)
    for number in range(2, LAST + 1):
        walk.key("PageDown", number)
    return walk


def strip_leaves_room(page, number: int) -> None:
    """The leader's strip is on screen and covers none of the chapter's title, buttons and figure."""
    strip = box(page, STRIP)
    assert strip["y"] >= 0 and strip["x"] + strip["width"] <= page.viewport_size["width"], (number, strip)
    for other in UNDER_STRIP:
        if page.locator(other).count():  # the first chapter has no Back, the last no Next chapter
            assert not overlap(strip, box(page, other)), (number, other)


def whole_characters(page, key: str) -> None:
    """The token stream shows characters and whole words, never a byte chip; nothing on the page (nor a tooltip)
    is U+FFFD; a chart is drawn beside it (Case 2's figure is the alignment table)."""
    chips = [t.strip() for t in page.locator(STREAM_CHIPS).all_inner_texts()]
    stream = page.locator(".st-key-token-stream .kv-stream").inner_text()
    assert "⟨" not in stream and REPLACEMENT not in stream, (key, chips)  # no byte chips
    for word in WHOLE_WORDS[key]:
        assert word in chips, (key, word, chips)  # a whole word is one chip
    if key != "prefix_case2":
        expect(page.locator(".st-key-chapter-figure [data-testid='stPlotlyChart']").first).to_be_visible()
    everything = page.evaluate(
        "() => document.body.textContent + [...document.querySelectorAll('[title]')].map(e => e.title).join(' ')"
    )
    assert REPLACEMENT not in everything, key


def controls_then_arrow(page, number: int, lang: str) -> None:
    """In chapter `number`, a click on each kind of control its view shows, each followed by →: the step advances
    (the chapter's text was checked on arrival; a control changes what the next visit would show, so each is
    clicked on the way back, where no chapter is visited again)."""
    step = int(link(page)["step"])
    chapter = str(number)
    if number == number_of("long_context"):  # the costs view: the batch slider under the chapter's chart
        click_then_key(page, *batch_slider(page, 0.25), "ArrowRight", chapter=chapter, step=str(step + 1))
    elif number == number_of("kv_cache"):  # the KV view: the whole view's expander, then its K/V radio
        click_then_key(
            page, lambda: open_whole_view_in(page), nothing, "ArrowRight", chapter=chapter, step=str(step + 1)
        )
        click_then_key(page, *kv_radio(page, lang), "ArrowRight", chapter=chapter, step=str(step + 2))
        close_whole_view(page)
    elif number == number_of("attention"):  # the attention view: the layer picker and the scores toggle
        click_then_key(page, *layer_picker(page), "ArrowRight", chapter=chapter, step=str(step + 1))
        click_then_key(page, *scores_on(page), "ArrowRight", chapter=chapter, step=str(step + 2))


def kv_radio(page, lang: str):
    """The KV view's K/V radio set to V: drawn once the values chart's title names V."""
    layer = int(widget(page, "w_layer").locator("input").input_value())
    head = int(widget(page, "w_head").locator("input").input_value())
    title = strings.t("values_title", lang, which="V", layer=layer, kv=0, head=head).split("KV")[0]
    label = widget(page, "v_kv").locator("label", has_text="V")
    return label.click, lambda: text_on_page(page, title)


def close_whole_view(page) -> None:
    """Close the whole view again: the chapters after this one are walked as a class sees them, with it closed."""
    widget(page, "x_whole_view").locator("summary").first.click()  # its own; the KV view has one inside
    page.wait_for_function("() => !document.querySelector('.st-key-x_whole_view details[open]')", timeout=WAIT_MS)
    settled_text(page)

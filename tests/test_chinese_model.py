"""A Chinese class on the Chinese embedded model (Gemma 3 270M, `embedded-zh`) in headless Chromium: a page in
Chinese opens on it, and the lesson's chapters on tokens, attention, paging and the article's Case 2 show
characters and whole words in the token stream (never a byte chip or U+FFFD) beside their figure. Needs Debian's
chromium and the `playwright` package, as tests/test_browser.py."""

import pytest
from playwright.sync_api import expect

from engine.characters import REPLACEMENT
from tests.server import settled_text
from ui.lesson import CHAPTERS

pytestmark = pytest.mark.browser

STREAM_CHIPS = ".st-key-token-stream .kv-stream > .kv-chip"  # the stream's own chips, not the legend's
CHAPTER_KEYS = ("tokens", "attention", "paging", "prefix_case2")  # chapters 1, 6, 9 and 13 of the articles' order
WORDS = {"tokens": ["什么是", "缓存"], "attention": ["什么是", "缓存"], "paging": ["什么是", "缓存"],
         "prefix_case2": ["解释", "什么是", "语言", "模型"]}  # whole words Gemma's tokenizer keeps as one token


def test_a_chinese_lesson_on_the_chinese_model_shows_characters_and_its_figures(server, page, embedded_zh_model):
    for key in CHAPTER_KEYS:
        chapter = next(c for c in CHAPTERS if c.key == key)
        page.goto(f"{server}/?chapter={chapter.number}&lang=zh&large=1")
        settled_text(page)
        assert chapter.part("title", "zh") in page.locator("h1").inner_text()
        chips = [t.strip() for t in page.locator(STREAM_CHIPS).all_inner_texts()]
        stream = page.locator(".st-key-token-stream .kv-stream").inner_text()
        assert "⟨" not in stream and REPLACEMENT not in stream, (key, chips)  # no byte chips
        for word in WORDS[key]:
            assert word in chips, (key, word, chips)  # a whole word is one chip
        figure = page.locator(".st-key-chapter-figure")
        assert figure.count() == 1 and figure.bounding_box()["height"] > 100, key  # the chapter's figure is drawn
        if key != "prefix_case2":  # its figure is the alignment table; the others are charts
            expect(figure.locator("[data-testid='stPlotlyChart']").first).to_be_visible()  # Plotly loads after the text
        everything = page.evaluate("() => document.body.textContent + [...document.querySelectorAll('[title]')]"
                                   ".map(e => e.title).join(' ')")
        assert REPLACEMENT not in everything, key
    assert "model" not in page.url  # the Chinese model is a Chinese page's default: not written into the link

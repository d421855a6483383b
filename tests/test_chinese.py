"""A Chinese prompt in headless Chromium, as a Chinese class opens it (issue 11): the characters in the token
stream, never a byte chip or U+FFFD. Needs Debian's chromium and the `playwright` package, as
tests/test_browser.py."""

from urllib.parse import urlencode

import pytest

from engine.characters import REPLACEMENT
from tests.helpers import STREAM_CHIPS
from tests.server import settled_text
from ui.text import strings

pytestmark = pytest.mark.browser

PROMPT = "解释什么是Transformer"


def test_a_chinese_prompt_shows_characters_not_bytes(server, page, tokenizer):
    # SmolLM2's byte-level tokenizer (a page in Chinese opens on embedded-zh otherwise: tests/test_lesson_walk.py's
    # Chinese walk)
    page.goto(
        f"{server}/?" + urlencode({"prompt": PROMPT, "chat": "0", "step": "3", "lang": "zh", "model": "embedded"})
    )
    settled_text(page)
    chips = [t.strip() for t in page.locator(STREAM_CHIPS).all_inner_texts()]
    ids = tokenizer.encode(PROMPT, add_special_tokens=False)
    assert len(chips) < len(ids) + 3  # some characters are several tokens: fewer chips than tokens …
    assert chips[:5] == list("解释什么是")  # … and each of those is one chip holding its character
    assert page.locator(".st-key-token-stream .kv-token").count() == len(ids) + 3  # still one element per token
    stream = page.locator(".st-key-token-stream .kv-stream").inner_text()
    assert "⟨" not in stream
    note = page.locator(".st-key-token-stream details.kv-note")  # byte-level BPE explained beside the chips
    assert note.locator("summary").inner_text().strip().endswith(strings.t("legend_hover_bpe", "zh"))
    note.locator("summary").click()
    assert note.inner_text().strip().endswith(strings.t("bpe_explained", "zh"))
    shown = page.locator('[data-testid="stMain"]').inner_text() + page.locator('[data-testid="stSidebar"]').inner_text()
    everything = page.evaluate(
        "() => document.body.textContent + [...document.querySelectorAll('[title]')].map(e => e.title).join(' ')"
    )  # figure text (SVG) and hovers too
    assert REPLACEMENT not in shown and REPLACEMENT not in everything
    tips = page.evaluate("() => [...document.querySelectorAll('.st-key-token-stream .kv-token')].map(e => e.title)")
    assert len(tips) == len(ids) + 3 and all("字节" in tip and "bytes" not in tip for tip in tips), tips
    shi = tokenizer.convert_ids_to_tokens(tokenizer.encode("是", add_special_tokens=False))  # 'æĺ¯': bytes, not text
    assert not [tip for tip in tips if any(piece in tip for piece in shi)], tips
    assert "解" in shown and "Transformer" in shown

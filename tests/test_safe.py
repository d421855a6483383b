"""User and model text inside Markdown shows as text: `ui.text.safe.text` against markup payloads.

The Markdown is rendered the way Streamlit's front end reads it where Python can: CommonMark (markdown-it)
for links, images, headings, emphasis and code spans; the browser test (tests/test_browser.py) checks the
rest (colours, formulas, web addresses turned into links) in the real page.
"""

import re
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from markdown_it import MarkdownIt

import ui.runs.run
from tests.app_helpers import start
from ui.text import safe

PHISHING = "x` **[Log in again](https://evil.example/login)** `"
PAYLOADS = [
    "x` **[Log in again](https://evil.example/login)** `",
    "![x](http://evil.example/pixel.png)",
    "# SERVER COMPROMISED",
    "ok\n# heading on a new line",
    ":red[SERVER COMPROMISED — send password to teacher]",
    "$x^2$ and $$\\int x$$",
    "<img src=http://evil.example/i.png> <b>bold</b>",
    "https://evil.example/auto www.evil.example me@evil.example",
    "*a* _b_ ~~c~~ | d | e |",
    "\\*escaped already\\*",
]
MARKDOWN = MarkdownIt("commonmark").enable("strikethrough").enable("table")


def render(markdown: str) -> str:
    return MARKDOWN.render(markdown)


@pytest.mark.parametrize("payload", PAYLOADS)
def test_markup_payload_renders_as_its_own_text(payload):
    html = render(f"Value “{safe.text(payload)}” ignored.")
    assert re.fullmatch(r"<p>[^<]*</p>\n", html), html  # one paragraph of text: no element at all
    shown = re.sub("&quot;", '"', re.sub("&lt;", "<", re.sub("&gt;", ">", re.sub("&amp;", "&", html))))
    assert payload.replace("\n", "↵") in shown.replace("\u2060", "")


@pytest.mark.parametrize("payload", PAYLOADS)
def test_no_streamlit_markup_survives(payload):
    """What CommonMark leaves alone but Streamlit reads: colours, emoji, formulas and bare web addresses."""
    shown = safe.text(payload)
    assert not re.search(r"(?<!\\):\w", shown)  # `:red[`, `:smile:` start with an unescaped colon
    assert not re.search(r"(?<!\\)\$", shown)
    assert not re.search(r"https?:/|www\.|@\w", shown.replace("\\", ""))  # the word joiner splits addresses
    assert "\n" not in shown


@given(st.text())
def test_any_text_is_one_paragraph_of_itself(value):
    html = render("a " + safe.text(value) + " b")
    assert html.count("<p>") <= 1 and not re.search(r"<(?!/?p>)", html), html


def test_t_shows_every_value_as_text_and_keeps_number_formats():
    """The one `t` (the page's and every view's): strings and other objects escaped, numbers formatted, a
    string `t` made kept as the Markdown it is."""
    from ui.text import strings

    assert "0.123" in strings.t("vectors_note", "en", diff=0.12345)
    assert (
        strings.t("link_problem", "en", param="step", value="`x`", fallback="0", reason="r")
        == "Link value “step=\\`x\\`” was not usable (r); using “0” instead."
    )
    reason = strings.t("reason_below_floor")  # ours, with a dash: kept, not escaped twice
    assert strings.t("prompt_cleaned", "en", reason=reason) == f"The prompt was changed before running: {reason}."
    assert strings.t("bad_input", "en", error=ValueError(PHISHING)) == "Cannot run this: " + safe.text(PHISHING)


def test_a_chapter_shows_its_text_facts_as_text():
    from ui.lesson.chapters import fill

    assert (
        fill("{name} has {layers} layers{missing:.1f}", {"name": PHISHING, "layers": 30})
        == safe.text(PHISHING) + " has 30 layers–"
    )


# -- the page uses it wherever user or model text meets Markdown ------------------------------


def markdown_shown(at) -> list[str]:
    return [e.value for e in at.markdown] + [e.value for e in at.error] + [w.value for w in at.warning]


def test_a_model_id_from_a_link_shows_as_text_when_it_fails_to_load(monkeypatch, embedded_model):
    monkeypatch.setenv("KVSCOPE_ALLOW_ANY_MODEL", "1")
    at = start(model=PHISHING)
    assert not at.exception
    assert any(safe.text(PHISHING) in e.value for e in at.error), [e.value for e in at.error]
    assert not any("](https://evil" in m for m in markdown_shown(at))


def test_the_models_own_token_shows_as_text(monkeypatch, embedded_model):
    """A generated token is the model's output: in the flow view's two paths and the candidates' title."""
    real = ui.runs.run.token_cells

    def cells_with_markup(*args):
        cells = real(*args)
        return cells[:-1] + [replace(cells[-1], text=PHISHING)]

    monkeypatch.setattr(ui.runs.run, "token_cells", cells_with_markup)  # where a run makes its cells, once per step
    at = start(step=1, view="flow", prompt="Whose token is this?")  # a run no other test made
    assert not at.exception
    shown = markdown_shown(at)
    assert sum(safe.text(PHISHING) in m for m in shown) >= 2, shown  # "Why …?" and "Path 1 → the user"
    assert not any("](https://evil" in m for m in shown)


PLOTLY_TAGS = re.compile(r"<\s*/?\s*(a|b|i|br|span|sub|sup|em|s|u)\b", re.IGNORECASE)


def test_token_text_in_figure_labels_is_not_plotly_markup():
    """Plotly reads <a href>, <b>, <br>, <span style> inside labels: a token's text must reach it escaped."""
    import numpy as np

    from viz.attention import heatmap_figure
    from viz.kv_cache import pool_figure

    labels = ['<a href="https://evil.example">log in</a>', "<b>bold</b>", "x<br>y", "plain"]
    heat = heatmap_figure(np.full((4, 4), 0.25), labels)
    pool = pool_figure([0], 4, 4, 2, labels)
    shown = list(heat.data[0].x) + list(heat.data[0].y) + [t for row in pool.data[0].text for t in row]
    assert not [s for s in shown if PLOTLY_TAGS.search(s)], shown
    assert "0:&lt;a href=\"https://evil.example\"&gt;log in&lt;/a&gt;" in list(heat.data[0].x)

"""Driving the app headless with AppTest: shared by the app tests and the bad-input catalogue."""

from pathlib import Path

from streamlit.testing.v1 import AppTest

# The title each view opens with (a key into ui.text.strings).
VIEW_TITLES = {
    "flow": "flow_title",
    "attention": "attention_title",
    "kv": "kv_title",
    "split": "split_title",
    "prefix": "prefix_title",
    "costs": "costs_title",
    "eviction": "evict_title",
    "serving": "serve_title",
    "speculate": "spec_title",
}
APP = str(Path(__file__).resolve().parent.parent / "app.py")


def start(**params) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    for key, value in params.items():
        at.query_params[key] = str(value)
    return at.run()


def open_whole_view(at: AppTest) -> AppTest:
    """In the lesson: open the whole view under the chapter (its other figures, tables, controls and the text), as
    a click on its expander does."""
    at.session_state["x_whole_view"] = True
    return at.run()


def shown_text(at: AppTest) -> str:
    """The plain text inside the container keyed `generated`."""
    texts = [c.value for c in at.code]
    assert texts, "no plain-text element on the page"
    return texts[0]


def assert_clean(at: AppTest):
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]


def secret_of(at: AppTest) -> str:
    """The secret of the room a leading page leads (kept in the teacher's browser, never in its link)."""
    return at.session_state["follow"].secret


def step_of(at: AppTest) -> int:
    return int(at.query_params["step"])


def keeps_working(at: AppTest) -> None:
    """After bad input the page still steps: Next adds a token and nothing raises."""
    before = step_of(at)
    at.button(key="b_next").click().run()
    assert not at.exception, at.exception
    assert step_of(at) == before + 1, "the Next button no longer steps"

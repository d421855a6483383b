"""End to end in headless Chromium: a shared link restores the text; the Right arrow steps and updates the link.

Needs Debian's chromium (`apt-get install chromium`) and the `playwright` package; `.ci/run` installs both.
"""

from urllib.parse import parse_qs, quote, urlparse

import pytest
from playwright.sync_api import sync_playwright

import engine
from tests.server import CHROMIUM, CHROMIUM_ARGS, running_server, settled_text


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("server") / "log.txt") as (url, _):
        yield url


@pytest.fixture(scope="module")
def page():
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser.new_page(viewport={"width": 1600, "height": 1000})
        browser.close()


def expected(model, prompt: str, steps: int) -> str:
    session = engine.DecodeSession(model, prompt, chat=True, max_new_tokens=256)
    session.prefill()
    for _ in range(steps - 1):
        session.step()
    return model.tokenizer.decode(session.prompt_ids) + session.text


def test_shared_link_restores_then_right_arrow_steps(server, page, embedded_model):
    prompt = "Name three colours."
    page.goto(f"{server}/?prompt={quote(prompt)}&step=3&view=attention")
    assert settled_text(page) == expected(embedded_model, prompt, 3)
    page.locator("h1").first.click()  # focus the page, not a text field
    page.keyboard.press("ArrowRight")
    page.wait_for_function("() => new URL(location.href).searchParams.get('step') === '4'", timeout=120_000)
    assert settled_text(page) == expected(embedded_model, prompt, 4)
    query = parse_qs(urlparse(page.url).query)
    assert query["step"] == ["4"] and query["prompt"] == [prompt] and query["view"] == ["attention"]
    page.keyboard.press("ArrowLeft")
    page.wait_for_function("() => new URL(location.href).searchParams.get('step') === '3'", timeout=120_000)
    assert settled_text(page) == expected(embedded_model, prompt, 3)

"""End to end in headless Chromium: a shared link restores the text; the Right arrow steps and updates the link.

Needs Debian's chromium (`apt-get install chromium`) and the `playwright` package; `.ci/run` installs both.
"""

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import parse_qs, quote, urlparse

import pytest
from playwright.sync_api import sync_playwright

import engine

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"), "--server.port", str(port),
         "--server.address", "127.0.0.1", "--server.headless", "true", "--browser.gatherUsageStats", "false"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if urllib.request.urlopen(url + "/_stcore/health", timeout=2).status == 200:
                break
        except OSError:
            time.sleep(0.5)
    else:
        process.kill()
        pytest.fail("the Streamlit server did not start within 120 s")
    yield url
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture(scope="module")
def page():
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser.new_page(viewport={"width": 1600, "height": 1000})
        browser.close()


def settled_text(page) -> str:
    """Wait for the script run to finish, then read the text container."""
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=120_000)
    page.wait_for_selector(".st-key-generated code", timeout=120_000)
    return page.eval_on_selector(".st-key-generated code", "el => el.textContent")


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

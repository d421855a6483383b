"""A class at once: `SESSIONS` browser sessions on the session's server, each with its own prompt, opening together and
stepping together.

Checks what must hold however busy the server is: no errors, every session gets its own prompt and tokens and sees
no other's, and no prompt reaches the server's log. How much memory and time a class takes is measured by
bench/class_on_host.py and bench/class_open.py (thirty sessions), not asserted here.
"""

from urllib.parse import quote

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests.helpers import IDLE

pytestmark = pytest.mark.load

SESSIONS = 6  # more than the two explorers the server runs at once (ui/runs/turns.py): pages wait their turn
STEPS = 2  # Right-arrow presses per session after the link's own step
WAIT_MS = 300_000  # any one wait: every session's page shares 2 cores with the server


def prompt_for(i: int) -> str:
    return f"Student {i:02d} asks: what is token number {i * 7 + 3}?"


def settled(page) -> str:
    """The step's text once the run has finished; a page that never shows it fails with what it shows."""
    try:
        page.wait_for_selector(".st-key-generated code", timeout=WAIT_MS)
        page.wait_for_selector(IDLE, timeout=WAIT_MS)
    except PlaywrightTimeout:
        raise AssertionError(f"the page did not settle on a step: {page_state(page)}") from None
    return page.eval_on_selector(".st-key-generated code", "el => el.textContent")


def reaches_step(page, step: int) -> None:
    """Wait until the link says `step`. A press that landed while the page was still finishing a run met greyed
    buttons and was refused (by design, tests/test_browser.py pins it): press again once the page is idle."""
    reached = f"() => Number(new URL(location.href).searchParams.get('step')) >= {step}"
    for _ in range(3):
        page.wait_for_selector(IDLE, timeout=WAIT_MS)
        try:
            page.wait_for_function(reached, timeout=5_000)
            return
        except PlaywrightTimeout:
            if page.evaluate(reached):
                return
            page.keyboard.press("ArrowRight")
    page.wait_for_function(reached, timeout=WAIT_MS)


def page_state(page) -> str:
    """What a page that stopped stepping shows, for the failure message: its link, run state, step buttons,
    alerts and focused element."""
    return page.evaluate("""() => ({
        url: location.href,
        state: document.querySelector('[data-testid=stApp]').getAttribute('data-test-script-state'),
        next_live: document.querySelectorAll('.st-key-b_next button:not([disabled])').length,
        next_busy: document.querySelectorAll('.st-key-b_next_busy').length,
        alerts: [...document.querySelectorAll('[data-testid=stAlert]')].map(e => e.innerText.slice(0, 200)),
        focus: document.activeElement && document.activeElement.tagName,
    })""")


def test_a_class_at_once_each_page_gets_its_own_text_and_nothing_leaks(browser, app_server):
    url, _, log_path = app_server
    contexts = [browser.new_context(viewport={"width": 1280, "height": 900}) for _ in range(SESSIONS)]  # own cookies
    try:
        pages = [context.new_page() for context in contexts]
        for i, page in enumerate(pages):  # every page opens before any is waited for: the server has them all at once
            page.goto(
                f"{url}/?prompt={quote(prompt_for(i))}&step=1&view={['flow', 'attention', 'kv'][i % 3]}",
                wait_until="commit",
            )
        first = [settled(page) for page in pages]
        for step in range(2, STEPS + 2):
            for page in pages:  # every page presses before any is waited for
                page.locator("h1").first.click()
                page.keyboard.press("ArrowRight")
            for page in pages:
                reaches_step(page, step)
        last = [settled(page) for page in pages]
        errors = [
            page.locator('[data-testid="stException"], [data-testid="stAlertContentError"]').count() for page in pages
        ]
    finally:
        for context in contexts:
            context.close()
    for i in range(SESSIONS):
        own = prompt_for(i)
        assert errors[i] == 0, f"session {i} shows an error"
        assert own in first[i] and own in last[i] and last[i].startswith(first[i])
        assert len(last[i]) > len(first[i])
        others = [prompt_for(j) for j in range(SESSIONS) if j != i]
        assert not any(o in last[i] for o in others), f"session {i} sees another student's prompt"
    log = log_path.read_text()
    assert not any(prompt_for(i) in log for i in range(SESSIONS)), "a prompt reached the server log"

"""End to end in headless Chromium: a fresh server says what it is loading; a shared link restores the text; the
Right arrow steps and updates the link; markup in a link shows as text; an open page survives a server restart; the
link always equals the screen.

Needs Debian's chromium (`apt-get install chromium`) and the `playwright` package; `.ci/run` installs both.
"""

import time
from urllib.parse import parse_qs, quote, urlencode, urlparse

import pytest

import engine
from tests.helpers import WAIT_MS, expected, until_link
from tests.server import restarted_server, running_server, settled_text
from ui.text import strings
from ui.state.link import VIEWS

pytestmark = pytest.mark.browser


PAGE = {"width": 1600, "height": 1000}  # the module's page (conftest.py)


@pytest.fixture(scope="module")
def fresh_server(tmp_path_factory):
    """A server of this module's own that has loaded no model yet: (url, process, folder for its logs). The first
    test here reads what its first pages say; the restart test then restarts it."""
    folder = tmp_path_factory.mktemp("fresh-server")
    with running_server(folder / "log.txt") as (url, process):
        yield url, process, folder


def test_a_fresh_servers_first_pages_say_what_they_load_and_no_streamlit_chrome(fresh_server, page):
    """First in this module: the server is fresh, so its first page view imports the engine and loads SmolLM2,
    and a Chinese lesson's first page loads the Chinese model (Gemma 3 270M), each saying so in its language."""
    url = fresh_server[0]
    page.goto(url)
    page.get_by_text(strings.t("starting")).wait_for(timeout=60_000)  # while the server imports the engine
    loading = page.get_by_text(strings.t("loading_embedded"))
    loading.wait_for(timeout=60_000)
    assert page.locator(".st-key-generated").count() == 0  # the messages come before the page they wait for
    settled_text(page)
    for chrome in ("stAppDeployButton", "stMainMenu"):
        assert page.locator(f'[data-testid="{chrome}"]').count() == 0, chrome
    running_man = page.locator('[data-testid="stStatusWidget"]')
    assert running_man.count() == 0 or not running_man.is_visible()
    page.reload()  # a second view of a loaded model goes straight to the page
    settled_text(page)
    assert loading.count() == 0
    page.goto(f"{url}/?chapter=1&lang=zh&large=1")  # a page in Chinese opens on the Chinese model
    page.get_by_text(strings.t("loading_embedded_zh", "zh")).wait_for(timeout=60_000)
    settled_text(page)


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


# -- markup in link values shows as text --------------------------------------------------------

LINK_PARAMS = ("step", "temperature", "seed", "lang", "view", "model", "policy", "prompt", "layer", "head",
               "block_size", "kv_splits")
# Each fits the 80 characters a link problem quotes, and would render as a phishing link, a tracking image,
# a heading, coloured text, a formula or a linked address if it were read as Markdown.
MARKUP_PAYLOADS = (
    "x` **[Log in again](https://evil.example/)** ![t](http://evil.example/t.png) `",
    "x`\n# SERVER :red[COMPROMISED] $x^2$ www.evil.example `",
)
MAIN = '[data-testid="stMain"]'


def markup_from_payloads(page) -> dict[str, int]:
    """Elements in the page's main area that only Markdown read from a payload would create."""
    main = page.locator(MAIN)
    counts = {selector: main.locator(selector).count() for selector in (
        'a[href*="evil.example"]', "img", ".stMarkdownColoredText", ".stMarkdownColoredBackground", ".katex")}
    headings = main.locator("h1, h2, h3, h4, h5, h6")
    counts["heading from payload"] = sum("SERVER" in headings.nth(i).inner_text() or "evil" in
                                         headings.nth(i).inner_text() for i in range(headings.count()))
    return {selector: n for selector, n in counts.items() if n}


def shown_as(payload: str) -> str:
    """How a payload reads on screen: one line (a newline shows as ↵), the 80 characters a link problem quotes."""
    return payload[:80].replace("\n", "↵")


def settled(page) -> None:
    """The first run has drawn the step (its text container) and finished. (Waiting for "notRunning" first could
    match the page before its first run started; the link's warnings come early in a run.)"""
    page.wait_for_selector(".st-key-generated code", timeout=120_000)
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=120_000)


@pytest.mark.parametrize("payload", MARKUP_PAYLOADS, ids=["link-and-image", "heading-colour-formula"])
def test_markup_in_every_link_value_shows_as_text(server, page, payload):
    page.goto(f"{server}/?" + urlencode({name: payload for name in LINK_PARAMS}))
    settled(page)
    assert markup_from_payloads(page) == {}
    text = page.locator(MAIN).inner_text().replace("\u2060", "")
    for name in LINK_PARAMS:
        if name != "prompt":  # a prompt may hold markup: it is used, not refused
            assert f"{name}={shown_as(payload)}" in text, name
    assert payload in page.eval_on_selector(".st-key-generated code", "el => el.textContent")


def test_markup_in_the_prompt_shows_as_text_in_every_view(server, page, embedded_model):
    """One page, each view in turn from the radio: the prompt's markup is text wherever the view shows tokens."""
    prompt = " ".join(MARKUP_PAYLOADS)
    page.goto(f"{server}/?" + urlencode({"prompt": prompt, "chat": "0", "step": "2"}))
    assert settled_text(page) == expected(embedded_model, prompt, 2, chat=False)
    for view in VIEWS:
        if view != VIEWS[0]:
            page.locator(".st-key-w_view label", has_text=strings.t("view_" + view)).click()
            until_link(page, view=view, step="2")
        assert markup_from_payloads(page) == {}, view


# -- a server restart, and fast presses -------------------------------------------------------

def url_step(page) -> int:
    return int(parse_qs(urlparse(page.url).query)["step"][0])


def chips(page) -> int:
    return page.locator(MAIN + " .kv-token").count()


# While the page has no server Streamlit disables its widgets: the live Next button (a run's greyed buttons have
# keys of their own) is disabled from the moment the page notices until it has reconnected (8.7 s → 9.7 s after a
# stop, in a run here). This notes that it was.
NEXT = ".st-key-b_next button"
WATCH_CONNECTION = """() => { window.kvLost = false; new MutationObserver(() => {
    if (document.querySelector('%s[disabled]')) window.kvLost = true; })
    .observe(document.body, {attributes: true, childList: true, subtree: true}); }""" % NEXT


def test_open_page_steps_after_a_server_restart(fresh_server, page, embedded_model):
    """The new server knows nothing of the page; its link and the press are enough. (A Chinese page on SmolLM2: the
    new server's first view says in Chinese that it starts and loads SmolLM2.)"""
    prompt = "Name three colours."
    url, process, folder = fresh_server
    page.goto(f"{url}/?prompt={quote(prompt)}&step=2&lang=zh&model=embedded&chat=1")
    assert settled_text(page) == expected(embedded_model, prompt, 2)
    page.evaluate(WATCH_CONNECTION)
    with restarted_server(url, process, folder / "log-after-restart.txt"):
        # The page noticed the lost connection and has reconnected, still showing step 2, its Next live again.
        page.wait_for_function(f"() => window.kvLost && document.querySelector('{NEXT}:not([disabled])')",
                               timeout=WAIT_MS)
        page.locator("h1").first.click()
        page.keyboard.press("ArrowRight")  # the new server's first run of this page
        page.get_by_text(strings.t("starting", "zh")).wait_for(timeout=WAIT_MS)
        page.get_by_text(strings.t("loading_embedded", "zh")).wait_for(timeout=WAIT_MS)
        page.wait_for_function("() => new URL(location.href).searchParams.get('step') === '3'", timeout=120_000)
        assert settled_text(page) == expected(embedded_model, prompt, 3)


def test_link_equals_screen_after_fast_presses(server, page, embedded_model):
    """Whatever number of presses counted, the link's step is the step on screen (text and token chips)."""
    prompt = "Count from one to one hundred."
    page.goto(f"{server}/?prompt={quote(prompt)}&step=1")
    settled_text(page)
    page.locator("h1").first.click()
    page.keyboard.press("ArrowRight")
    # While the step is computed the buttons are greyed: a press then is refused, visibly.
    page.wait_for_function("() => [...document.querySelectorAll('button')].some("
                           "b => b.innerText.includes('Next token') && b.disabled)", polling="raf", timeout=30_000)
    for _ in range(49):
        page.keyboard.press("ArrowRight")
    shown, calm = None, 0
    while calm < 3:  # settled: the same link and text for three checks a second apart
        time.sleep(1)
        now = (page.url, settled_text(page), chips(page))
        calm = calm + 1 if now == shown else 0
        shown = now
    step = url_step(page)
    prompt_tokens = len(engine.DecodeSession(embedded_model, prompt, chat=True).prompt_ids)
    assert (shown[1], shown[2]) == (expected(embedded_model, prompt, step), prompt_tokens + step)

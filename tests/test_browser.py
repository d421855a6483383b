"""End to end in headless Chromium: a fresh server says what it is loading; a shared link restores the text; the
Right arrow steps and updates the link; markup in a link shows as text; an open page survives a server restart; the
link always equals the screen.

Needs Debian's chromium (`apt-get install chromium`) and the `playwright` package; `.ci/run` installs both.
"""

from urllib.parse import parse_qs, quote, urlencode, urlparse

import pytest
from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

import engine
from tests.helpers import COUNT_SENDS, WAIT_MS, expected, until_link
from tests.server import restarted_server, running_server, settled_text
from ui.state.link import VIEWS
from ui.text import strings

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

LINK_PARAMS = (
    "step",
    "temperature",
    "seed",
    "lang",
    "view",
    "model",
    "policy",
    "prompt",
    "layer",
    "head",
    "block_size",
    "kv_splits",
)
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
    counts = {
        selector: main.locator(selector).count()
        for selector in (
            'a[href*="evil.example"]',
            "img",
            ".stMarkdownColoredText",
            ".stMarkdownColoredBackground",
            ".katex",
        )
    }
    headings = main.locator("h1, h2, h3, h4, h5, h6")
    counts["heading from payload"] = sum(
        "SERVER" in headings.nth(i).inner_text() or "evil" in headings.nth(i).inner_text()
        for i in range(headings.count())
    )
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
WATCH_CONNECTION = (
    """() => { window.kvLost = false; new MutationObserver(() => {
    if (document.querySelector('%s[disabled]')) window.kvLost = true; })
    .observe(document.body, {attributes: true, childList: true, subtree: true}); }"""
    % NEXT
)


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
        page.wait_for_function(
            f"() => window.kvLost && document.querySelector('{NEXT}:not([disabled])')", timeout=WAIT_MS
        )
        page.locator("h1").first.click()
        page.keyboard.press("ArrowRight")  # the new server's first run of this page
        page.get_by_text(strings.t("starting", "zh")).wait_for(timeout=WAIT_MS)
        page.get_by_text(strings.t("loading_embedded", "zh")).wait_for(timeout=WAIT_MS)
        page.wait_for_function("() => new URL(location.href).searchParams.get('step') === '3'", timeout=120_000)
        assert settled_text(page) == expected(embedded_model, prompt, 3)


class Asked:
    """A page's websocket in Streamlit's protocol, as the page sends and receives it: each run the page asks its
    server for, each run the server starts, how each ends, and the link each run writes. Registered before the
    page opens, with COUNT_SENDS (what the page has sent, counted in the page as it sends)."""

    ENDED = (ForwardMsg.FINISHED_SUCCESSFULLY, ForwardMsg.FINISHED_FRAGMENT_RUN_SUCCESSFULLY)  # not stopped for a rerun

    def __init__(self, page):
        self.sent = 0  # messages the page sent, as far as this process has heard
        self.events: list[str] = []  # "asked", "started", "ended", "stopped"
        self.query = ""  # the link the server last wrote
        self.socket = None
        page.add_init_script(COUNT_SENDS)
        page.on("websocket", self._opened)

    def _opened(self, socket) -> None:
        self.socket = socket
        socket.on("framesent", self._sent)
        socket.on("framereceived", self._received)

    def _sent(self, payload) -> None:
        self.sent += 1
        if isinstance(payload, bytes) and BackMsg.FromString(payload).WhichOneof("type") == "rerun_script":
            self.events.append("asked")

    def _received(self, payload) -> None:
        if not isinstance(payload, bytes):
            return
        message = ForwardMsg.FromString(payload)
        kind = message.WhichOneof("type")
        if kind == "new_session":
            self.events.append("started")
        elif kind == "script_finished":
            self.events.append("ended" if message.script_finished in self.ENDED else "stopped")
        elif kind == "page_info_changed":
            self.query = message.page_info_changed.query_string

    def answered(self, sent: int) -> bool:
        """The server has run all that the page asked for in its first `sent` messages: this process has heard of
        them all (its events come late), a run started after the last ask, and the last run ended rather than
        stopping for a rerun (presses that come during a run stop it: one run answers them all)."""
        if self.sent < sent:
            return False
        last = len(self.events) - self.events[::-1].index("asked") if "asked" in self.events else 0
        runs = self.events[last:]
        return "started" in runs and runs[-1] == "ended"

    def wait_until_answered(self, page) -> None:
        """Until the server has run all that the page has asked for so far."""
        # A press's message goes out in a task its key's handler queued (Streamlit batches widget changes with a
        # setTimeout 0): the page's next such task runs after it.
        sent = page.evaluate("() => new Promise(done => setTimeout(() => done(window.kvSent)))")
        if not self.answered(sent):
            self.socket.wait_for_event("framereceived", predicate=lambda _: self.answered(sent), timeout=WAIT_MS)


# Whether Next was ever greyed, seen at each change of the page (a frame can hold both the greyed and the live button
# when the step is quick and the browser slow to paint: polling each frame missed it once in CI).
WATCH_GREYED = """() => {
    window.kvGreyed = false;
    const greyed = () => [...document.querySelectorAll('button')].some(
        b => b.innerText.includes('Next token') && b.disabled);
    new MutationObserver(() => { window.kvGreyed ||= greyed(); })
        .observe(document.body, {subtree: true, childList: true, attributes: true, characterData: true});
}"""


def test_link_equals_screen_after_fast_presses(server, page, embedded_model):
    """Whatever number of presses counted, the link's step is the step on screen (text and token chips)."""
    prompt = "Count from one to one hundred."
    asked = Asked(page)
    page.goto(f"{server}/?prompt={quote(prompt)}&step=1")
    settled_text(page)
    page.locator("h1").first.click()
    page.evaluate(WATCH_GREYED)
    page.keyboard.press("ArrowRight")
    # While the step is computed the buttons are greyed: a press then is refused, visibly.
    page.wait_for_function("() => window.kvGreyed", timeout=WAIT_MS)
    for _ in range(49):
        page.keyboard.press("ArrowRight")
    asked.wait_until_answered(page)  # every press the page sent has been run: no run is to come
    step = int(parse_qs(asked.query)["step"][0])  # the link the last run wrote
    text = until_link(page, step=str(step))  # the page has drawn that run
    prompt_tokens = len(engine.Generation(embedded_model, prompt, chat=True).prompt_ids)
    assert (text, chips(page), url_step(page)) == (expected(embedded_model, prompt, step), prompt_tokens + step, step)

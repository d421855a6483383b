"""What the test modules share: a hand-moved clock, the text a page must show at a step, transformers' keys before
rotation, and a real browser page's waits and presses (Playwright's sync API; the server and the browser themselves
come from tests/server.py, the `page` fixture from conftest.py)."""

from urllib.parse import parse_qs, urlparse

import torch
from playwright.sync_api import TimeoutError as PlaywrightTimeout

import engine
from tests.server import settled_text
from ui.follow.teacher_browser import COOKIE

IDLE = '[data-testid="stApp"][data-test-script-state="notRunning"]'  # the page's script run has finished
WAIT_MS = 120_000  # a run on a loaded 2-core machine: the longest any one wait may take


class Clock:
    """A clock moved by hand (`clock.now += seconds`), for what takes its time from a callable (stores, leases)."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def expected(
    model, prompt: str, steps: int, chat: bool = True, kv_splits: int = 1, block_size: int | None = None, **sampling
) -> str:
    """The text a page shows at step `steps` (the prompt as the tokenizer decodes it, then the answer so far),
    computed by the engine directly with the page's settings (in bfloat16 a run in splits can draw other
    tokens than one unsplit: the merge rounds once where unsplit attention rounds its probabilities)."""
    generation = engine.Generation(
        model,
        prompt,
        chat=chat,
        sampling=engine.Sampling(**sampling),
        max_new_tokens=256,
        kv_splits=kv_splits,
        block_size=block_size,
    )
    generation.prefill()
    for _ in range(steps - 1):
        generation.step()
    return model.tokenizer.decode(generation.prompt_ids) + generation.text


def hf_keys_before_rotation(hf, ids: list[int]) -> tuple[object, list[torch.Tensor]]:
    """transformers' forward over `ids`: its cache, and each layer's keys before rotation as its k_norm (or k_proj
    where there is none) returns them, the batch's one sequence, in the module's own layout."""
    seen: list[torch.Tensor] = []
    hooks = [
        (getattr(layer.self_attn, "k_norm", None) or layer.self_attn.k_proj).register_forward_hook(
            lambda module, args, out: seen.append(out.detach()[0])
        )
        for layer in hf.model.layers
    ]
    try:
        with torch.inference_mode():
            cache = hf(torch.tensor([ids]), use_cache=True).past_key_values
    finally:
        for hook in hooks:
            hook.remove()
    return cache, seen


def idle(page) -> None:
    page.wait_for_selector(IDLE, timeout=WAIT_MS)


def widget(page, key: str):
    return page.locator(f".st-key-{key}")


def press(page, key: str) -> None:
    """Click the button keyed `key` once the page is idle (a press during a run may meet greyed buttons)."""
    idle(page)
    widget(page, key).get_by_role("button").first.click()  # .first: a help icon is a button too


def choose(page, key: str, option: str) -> None:
    """Pick `option` in the select box keyed `key`: its text typed into the box narrows the list to it (a long list
    draws only the options in view), then clicked. A rerun that lands meanwhile closes the list: it is opened again."""
    box = widget(page, key).locator('[role="combobox"]')
    item = page.locator('[role="option"]', has_text=option).first
    for _ in range(3):
        idle(page)
        box.click()
        box.fill(option)
        try:
            item.wait_for(state="visible", timeout=10_000)
            item.click(timeout=10_000)
            return
        except PlaywrightTimeout:
            page.keyboard.press("Escape")
    raise AssertionError(f"{option!r} was never offered in the select box {key!r}")


def open_whole_view_in(page) -> None:
    """In the lesson: click the whole view under the chapter open, and wait until its parts are drawn."""
    idle(page)
    parts = ".st-key-x_whole_view [data-testid='stElementContainer']"
    closed = page.locator(parts).count()  # its controls only
    widget(page, "x_whole_view").locator("summary").first.click()  # its own; an expander inside it has one too
    page.wait_for_function(f"() => document.querySelectorAll({parts!r}).length > {closed}", timeout=WAIT_MS)
    idle(page)


class Received:
    """What the server sent a page over its websocket since `clear`."""

    def __init__(self, page):
        self.frames: list[bytes] = []
        page.on("websocket", lambda socket: socket.on("framereceived", lambda frame: self.frames.append(frame)))

    def clear(self) -> None:
        self.frames.clear()

    def carries(self, text: str) -> bool:
        return any(text.encode() in (f if isinstance(f, bytes) else f.encode()) for f in self.frames)


# An init script: `window.kvSent` counts the messages the page sends its server (a press, a widget's change, a tick).
COUNT_SENDS = """(() => { const send = WebSocket.prototype.send; window.kvSent = 0;
    WebSocket.prototype.send = function (...args) { window.kvSent += 1; return send.apply(this, args); }; })()"""


def wait_until(page, condition, timeout_ms: int = WAIT_MS) -> None:
    """Wait until `condition()` (of what the test process has heard from the page, e.g. a `Received`) holds; the
    page's events arrive while Playwright waits."""
    waited = 0
    while not condition():
        assert waited < timeout_ms, f"not within {timeout_ms} ms"
        page.wait_for_timeout(50)  # Playwright's own wait: the page's events are handled meanwhile
        waited += 50


def link(page) -> dict[str, str]:
    return {name: values[0] for name, values in parse_qs(urlparse(page.url).query).items()}


def leader_secret(page) -> str:
    """The secret of the room `page` leads, from its browser's cookie (`ui.follow.teacher_browser`), once set."""
    page.wait_for_function(f"() => document.cookie.includes('{COOKIE}=')", timeout=WAIT_MS)
    return next(c["value"] for c in page.context.cookies() if c["name"] == COOKIE)


def until_link(page, **expected_link) -> str:
    """Wait until the link holds `expected_link` (None: not in the link) and the run has finished; the text shown
    ("" on the Serving view, which shows its requests' texts instead). The link is written at the end of a run that
    drew the step, so the page is idle once the run after it, if any, has finished."""
    condition = " && ".join(
        f"p.get({name!r}) === {'null' if value is None else repr(str(value))}" for name, value in expected_link.items()
    )
    page.wait_for_function(
        f"() => {{ const p = new URL(location.href).searchParams; return {condition}; }}", timeout=WAIT_MS
    )
    if link(page).get("view") == "serving":
        idle(page)
        return ""
    return settled_text(page)


def metric_value(page, key: str) -> str:
    return widget(page, key).locator('[data-testid="stMetricValue"]').inner_text().strip()


# True once the element is drawn and its box has stayed the same for `frames` painted frames with no element left
# from the last run on the page. Its state is kept on `window` between the frames Playwright polls it in. An element
# not drawn yet is not settled: between two runs (a fragment's run handing over to the whole page's) the page says
# "not running" for a moment while the next run's elements are still to come.
# Stale elements of the follow strip's and banner's timed fragments do not count: they rerun on their own clock (a
# leader's every second), and on a loaded machine one of them was always mid-run, so a teacher's page never settled.
STILL_BOX = """([selector, frames]) => {
    const el = document.querySelector(selector), r = el && el.getBoundingClientRect();
    const now = r ? [r.x, r.y, r.width, r.height].join() : null;
    const stale = [...document.querySelectorAll('[data-testid="stMain"] [data-stale="true"]')]
        .some(e => !e.closest('.st-key-follow-lead, .st-key-follow-banner'));
    if (now === null || stale || window.kvBox !== now) { window.kvBox = now; window.kvStill = 0; return false; }
    return ++window.kvStill >= frames; }"""


def settled_box(page, selector: str, frames: int = 10) -> dict:
    """The bounding box of `selector` once the page has drawn it and stopped changing it: no element left from the
    last run (Streamlit marks those `data-stale` until it clears them) and the box the same for `frames` painted
    frames (a chart being mounted draws at a default height first). Fails if it is not drawn within `WAIT_MS`."""
    page.evaluate("() => { window.kvBox = undefined; }")
    try:
        page.wait_for_function(STILL_BOX, arg=[selector, frames], polling="raf", timeout=WAIT_MS)
    except PlaywrightTimeout:
        stale = page.evaluate("""() => [...document.querySelectorAll('[data-testid="stMain"] [data-stale="true"]')]
            .map(e => (e.className || '').slice(0, 80) + ' ' + e.outerHTML.slice(0, 120))""")  # what kept it unsettled
        raise AssertionError(
            f"{selector} was not drawn and still within {WAIT_MS} ms; its box at the end "
            f"{page.evaluate('window.kvBox')}; stale elements {stale[:6]}"
        ) from None
    return page.locator(selector).bounding_box()


def overlap(a: dict, b: dict) -> bool:
    """Whether two bounding boxes overlap."""
    return (
        a["x"] < b["x"] + b["width"]
        and b["x"] < a["x"] + a["width"]
        and a["y"] < b["y"] + b["height"]
        and b["y"] < a["y"] + a["height"]
    )


def box(page, selector: str) -> dict:
    """The bounding box of the one element `selector` finds, drawn."""
    locator = page.locator(selector)
    assert locator.count() == 1, f"{selector}: {locator.count()} on the page"
    found = locator.bounding_box()
    assert found is not None, f"{selector} is not drawn"
    return found


STREAM_CHIPS = ".st-key-token-stream .kv-stream > .kv-chip"  # the stream's own chips, not the legend's

# Button labels and the title cut by their box (in the page, not in the closed sidebar); token chips outside theirs.
NOT_CUT = """() => [...document.querySelectorAll(
    '.st-key-b_chapter_back button p, .st-key-b_chapter_next button p, [class*="st-key-b_"] button p, h1')]
    .filter(el => el.offsetParent !== null && el.getBoundingClientRect().right > 0)  // not in the closed sidebar
    .filter(el => el.scrollWidth > el.clientWidth + 1).map(el => el.textContent)"""
# the token chips outside the token stream's box (-1: the page shows no stream, as the Serving view)
CHIPS_OUTSIDE = """() => { const stream = document.querySelector('.kv-stream-box'); if (!stream) return -1;
    const box = stream.getBoundingClientRect();
    return [...document.querySelectorAll('.kv-stream-box .kv-chip')].map(c => c.getBoundingClientRect())
        .filter(c => c.bottom > box.top && c.top < box.bottom)  // the chips scrolled into the box's view
        .filter(c => c.left < box.left - 1 || c.right > box.right + 1).length; }"""

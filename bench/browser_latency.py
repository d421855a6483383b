"""What a class waits for, in headless Chromium on the embedded model: per view, a press of → until the next
token's text is on screen and until the step is drawn; chapter changes (PageDown) and going back (PageUp);
followers' lag behind a leader's press; ← at the limits' worst case.

    python bench/browser_latency.py [--presses 6] [--warm 2] [--followers 3] [--before /path/to/old/checkout]
        [--parts views,switch,chapters,play,follow,worst]

With --before, the same measurements run first on the app of another checkout (e.g. a `git worktree` of the
previous release), then on this one, in the same run: before/after figures from the same machine and minute.

Per view, at about 200 cached tokens, each view on its own run (its own seed: every → computes a step), median
and p90 over the presses, after warm-up presses:
- token: → until the header names the new step and the token it output (the first sign of the step on screen);
- text: → until the new token's text is in the `generated` container (under the view);
- drawn: → until the script run has finished (Streamlit idle) and the browser has painted two frames;
- server: → until the run's last message arrived over the websocket (loopback: the server's own time, from
  the press's arrival to its last message, plus the browser's sending of the press);
- bytes: what the websocket carried from the server for one press.
Switch: on one page at about 200 cached tokens, a click on each view's label in the view radio in turn (twice
round), until the link names the view, the run has ended and the browser has painted two frames.
Chapters: PageDown from chapter 1 to 14 (each a new chapter), then PageUp back to 1 (each visited), until the
link names the chapter and the page is idle. Followers: one leader page and N follower pages; the leader presses →
and each follower's counter must show the leader's step: the median and p90 over presses of the last
follower's lag. Worst (`--parts worst`, not in the default parts): per view, a page opens the link with block
size 1, a 382-token prompt and step 128, and presses ← (token and drawn as above); then the server's peak RSS.
Socket followers (`--parts sockets`, not in the default parts): the leader in Chromium and `--followers` followers
that are websocket sessions without a browser (`SocketFollower`: they open the students' link and only record what
the server sends): until the first, the median and the last follower was sent the new step (the last: the server's
whole share of following), with no follower page drawing on this machine's cores; the server's CPU time a press
(steadier than any time on a shared VM: what one more follower costs); and the leader's own → before any follower
joined, against its own with them.
Run by hand, not in CI.
"""

from __future__ import annotations

import argparse
import html
import statistics
import sys
import threading
import time
from pathlib import Path
from urllib.parse import quote, urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402
from playwright.sync_api import TimeoutError as PlaywrightTimeout  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402
from streamlit.proto.BackMsg_pb2 import BackMsg  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from bench.class_open import cpu_seconds  # noqa: E402
from tests.server import CHROMIUM, CHROMIUM_ARGS, ROOT, running_server, settled_text  # noqa: E402
from ui.text import strings  # noqa: E402

VIEWS = ("flow", "attention", "kv", "split", "prefix", "costs")
TEXT = '() => document.querySelector(".st-key-generated code")?.textContent ?? ""'
HEADER = '() => document.querySelector(".kv-header")?.textContent ?? ""'  # "step 9 · … output ·cache"
IDLE = '() => document.querySelector(\'[data-testid="stApp"]\')?.dataset.testScriptState === "notRunning"'
PAINTED = "() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(() => done(true))))"
WAIT_MS = 120_000


class Wire:
    """Counts what the server sends a page over its websocket, when the last message came, and when a message
    first carried a given text (`arrived`)."""

    def __init__(self, page):
        self.bytes, self.last = 0, 0.0
        self.frames: list[tuple[float, bytes]] = []  # kept only while `watching`
        self.watching = False
        page.on("websocket", self._watch)

    def _watch(self, socket) -> None:
        socket.on("framereceived", self._frame)

    def _frame(self, payload) -> None:
        self.bytes += len(payload)
        self.last = time.perf_counter()
        if self.watching:
            self.frames.append((self.last, payload if isinstance(payload, bytes) else payload.encode()))

    def arrived(self, text: str) -> float | None:
        """When the first frame since watching began carried `text` (None: none did)."""
        return first_carrying(self.frames, text)


def first_carrying(frames: list[tuple[float, bytes]], text: str, since: float = 0.0) -> float | None:
    """When the first of `frames` ((arrival, payload), in order) from `since` on carried `text` (None: none did)."""
    marker = text.encode()
    return next((at for at, payload in frames if at >= since and marker in payload), None)


def spread(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return f"{statistics.median(ordered):6.0f} ms (p90 {p90:6.0f})"


# Times a press on the page's own clock: from the key's arrival (keydown) to the first animation frame at which the
# header, then the text, showed the step, and one frame after the run ended (idle). A frame's callback runs just
# before it is painted, so what it sees is on screen in that frame. Waiting for each in turn from here instead
# would time when this script could ask again: a long task (Plotly drawing) delays the question, not the screen.
WATCH = (
    """([header, text]) => {
  const readHeader = """
    + HEADER
    + """, readText = """
    + TEXT
    + """, idle = """
    + IDLE
    + """;
  const changed = (now, before) => now !== "" && now !== before;  // a blanked placeholder is not news
  const times = {start: null, token: null, text: null, idle: null, drawn: null};
  window.kvPress = times;
  addEventListener("keydown", () => { times.start ??= performance.now(); }, {capture: true, once: true});
  const frame = () => {
    const now = performance.now();
    if (times.start !== null) {
      if (times.token === null && changed(readHeader(), header)) times.token = now;
      if (times.token !== null && times.text === null && changed(readText(), text)) times.text = now;
      if (times.idle !== null) times.drawn = now;
      else if (times.text !== null && idle()) times.idle = now;
    }
    if (times.drawn === null) requestAnimationFrame(frame);
  };
  requestAnimationFrame(frame);
}"""
)


def press_step(page, wire: Wire, key: str = "ArrowRight") -> dict[str, float]:
    """One → (or `key`) press on a settled page: times to token, text and drawn (on the page's clock, `WATCH`),
    to the last message (on this script's), and the bytes received."""
    page.evaluate(WATCH, [page.evaluate(HEADER), page.evaluate(TEXT)])
    sent_before = wire.bytes
    page.wait_for_timeout(50)
    start = time.perf_counter()
    page.keyboard.press(key)
    page.wait_for_function("() => window.kvPress.drawn !== null", timeout=WAIT_MS, polling=100)
    page.wait_for_timeout(300)  # late messages of this run still count as this press's
    times = page.evaluate("window.kvPress")
    return {
        "token": times["token"] - times["start"],
        "text": times["text"] - times["start"],
        "drawn": times["drawn"] - times["start"],
        "server": 1000 * (wire.last - start),
        "bytes": wire.bytes - sent_before,
    }


def views(browser, url: str, presses: int, warm: int) -> None:
    prompt = " ".join(["token"] * 190)  # about 200 cached tokens
    for seed, view in enumerate(VIEWS, start=3):
        # A seed per view: each view's presses compute their own steps. With one seed, every view after the
        # first would show steps the first had already computed (pages with the same settings share a run).
        page = browser.new_page(viewport={"width": 1280, "height": 720})
        wire = Wire(page)
        page.goto(f"{url}/?prompt={quote(prompt)}&chat=0&step=1&view={view}&temperature=1&seed={seed}")
        settled_text(page)
        page.locator("h1").first.click()
        runs = [press_step(page, wire) for _ in range(warm + presses)][warm:]
        kib = statistics.median(r["bytes"] for r in runs) / 1024
        print(
            f"  {view:9s} token {spread([r['token'] for r in runs])}  text {spread([r['text'] for r in runs])}  "
            f"drawn {spread([r['drawn'] for r in runs])}  server {spread([r['server'] for r in runs])}  "
            f"{kib:7.0f} KiB/press",
            flush=True,
        )
        back = [press_step(page, wire, "ArrowLeft") for _ in range(presses)]
        print(
            f"  {'':9s} ← to a computed step: token {spread([r['token'] for r in back])}  drawn "
            f"{spread([r['drawn'] for r in back])}",
            flush=True,
        )
        page.close()


def switch(browser, url: str, rounds: int = 2) -> None:
    """A click on each view's label in turn, `rounds` times round: until the link names it and the page is drawn."""
    prompt = " ".join(["token"] * 190)
    page = browser.new_page(viewport={"width": 1280, "height": 720})
    page.goto(f"{url}/?prompt={quote(prompt)}&chat=0&step=8&temperature=1&seed=3")
    settled_text(page)
    times: dict[str, list[float]] = {view: [] for view in VIEWS}
    for _ in range(rounds):
        for view in VIEWS[1:] + VIEWS[:1]:
            label = page.locator(".st-key-w_view label", has_text=strings.t("view_" + view))
            start = time.perf_counter()
            label.click()
            wanted = "null" if view == "flow" else repr(view)  # the default view is not in the link
            page.wait_for_function(
                f"() => new URL(location.href).searchParams.get('view') === {wanted}", timeout=WAIT_MS, polling="raf"
            )
            page.wait_for_function(IDLE, timeout=WAIT_MS, polling="raf")
            page.evaluate(PAINTED)
            times[view].append(1000 * (time.perf_counter() - start))
    every = [t for values in times.values() for t in values]
    print(
        "  view switch: "
        + ", ".join(f"{view} {statistics.median(values):.0f}" for view, values in times.items())
        + f" ms; all {spread(every)}, worst {max(every):.0f} ms",
        flush=True,
    )
    page.close()


WORST_LINK = "prompt=" + quote(" ".join(["token"] * 382)) + "&chat=0&block_size=1&step=128&temperature=1&seed=3"
WORST_VIEWS = VIEWS[:3] + ("kv&pool=busy",) + VIEWS[3:]  # the KV view's busy pool replays the run in another pool


def worst(browser, url: str, presses: int) -> None:
    """← at the limits' worst case (block size 1, a 382-token prompt, step 128) on every view: one page per view
    opens the link (the first computes the run, the others share it), then presses ← `presses` times."""
    for view in WORST_VIEWS:
        page = browser.new_page(viewport={"width": 1280, "height": 720})
        wire = Wire(page)
        start = time.perf_counter()
        page.goto(f"{url}/?{WORST_LINK}&view={view}", timeout=WAIT_MS)
        settled_text(page)
        opened = 1000 * (time.perf_counter() - start)
        page.locator("h1").first.click()
        try:
            back = [press_step(page, wire, "ArrowLeft") for _ in range(presses)]
        except PlaywrightTimeout:
            print(f"  {view:13s} open {opened:7.0f} ms; ← not drawn within {WAIT_MS / 1000:.0f} s", flush=True)
            page.close()
            continue
        print(
            f"  {view:13s} open {opened:7.0f} ms; ← token {spread([r['token'] for r in back])}  drawn "
            f"{spread([r['drawn'] for r in back])}, worst {max(r['drawn'] for r in back):6.0f} ms  "
            f"{statistics.median(r['bytes'] for r in back) / 1024:7.0f} KiB/press",
            flush=True,
        )
        page.close()


def peak_rss_mb(process) -> float:
    """The server process' peak resident memory (Linux: VmHWM), in MB."""
    status = Path(f"/proc/{process.pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM"))) / 1024


def chapter_in_link(page, number: int) -> None:
    page.wait_for_function(
        f"() => new URL(location.href).searchParams.get('chapter') === '{number}'", timeout=WAIT_MS, polling="raf"
    )
    page.wait_for_function(IDLE, timeout=WAIT_MS, polling="raf")
    page.evaluate(PAINTED)


def chapters(browser, url: str) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 720})
    page.goto(f"{url}/?chapter=1&large=1")
    settled_text(page)
    page.locator("h1").first.click()
    times: dict[str, list[float]] = {"PageDown": [], "PageUp": []}
    for key, numbers in (("PageDown", range(2, 15)), ("PageUp", range(13, 0, -1))):
        for number in numbers:
            start = time.perf_counter()
            page.keyboard.press(key)
            chapter_in_link(page, number)
            times[key].append(1000 * (time.perf_counter() - start))
            page.wait_for_timeout(200)
    for key, label in (("PageDown", "new chapter (PageDown 1→14)"), ("PageUp", "visited chapter (PageUp 14→1)")):
        print(f"  {label:32s} {spread(times[key])}, worst {max(times[key]):6.0f} ms", flush=True)
    page.close()


def counter(page) -> str:
    return page.evaluate('() => document.querySelector(".kv-counter")?.textContent ?? ""')


def followers(browser, url: str, count: int, presses: int) -> None:
    """A leader and `count` followers in one browser. Per press: the leader's own → until its counter moved; until
    the last follower's websocket carried the new counter ("sent": the server's part, whatever the browsers' load);
    until the last follower's screen showed it (all pages share this machine's cores with the server)."""
    leader = browser.new_page(viewport={"width": 1280, "height": 720})
    leader.goto(f"{url}/?lead=1&step=1")
    settled_text(leader)
    link = leader.locator(".st-key-follow-link a").get_attribute("href")
    assert link and "follow=" in link, link
    pages, wires = [], []
    for _ in range(count):  # one after another: 30 pages opening at once on 2 cores time out
        page = browser.new_page(viewport={"width": 1280, "height": 720})
        wires.append(Wire(page))
        page.goto(link, timeout=WAIT_MS)
        settled_text(page)
        pages.append(page)
    leader.locator("h1").first.click()
    lags, sent, own = [], [], []
    for _ in range(presses):
        before = counter(leader)
        for wire in wires:
            wire.frames, wire.watching = [], True
        start = time.perf_counter()
        leader.keyboard.press("ArrowRight")
        leader.wait_for_function(
            f"() => document.querySelector('.kv-counter')?.textContent !== {before!r}", timeout=WAIT_MS, polling="raf"
        )
        own.append(1000 * (time.perf_counter() - start))
        target = counter(leader)
        for page in pages:
            page.wait_for_function(
                f"() => document.querySelector('.kv-counter')?.textContent === {target!r}", timeout=WAIT_MS, polling=50
            )
        lags.append(1000 * (time.perf_counter() - start))
        arrivals = [wire.arrived('kv-counter">' + html.escape(target)) for wire in wires]
        sent.append(1000 * (max(a for a in arrivals if a is not None) - start))
        for wire in wires:
            wire.watching = False
        leader.wait_for_function(IDLE, timeout=WAIT_MS)
        time.sleep(1.0)
    print(
        f"  {count} followers: leader's own → {spread(own)}; last follower sent the step {spread(sent)}; "
        f"last follower shows it {spread(lags)}",
        flush=True,
    )
    alone = pages[0]  # a student steps on their own: told at once that the teacher's moves no longer move them
    alone.locator("h1").first.click()
    start = time.perf_counter()
    alone.keyboard.press("ArrowRight")
    alone.wait_for_function(
        f"() => document.body.innerText.includes({strings.t('follow_alone')!r})", timeout=WAIT_MS, polling="raf"
    )
    print(
        f"  a follower's own → until its banner says it left following: {1000 * (time.perf_counter() - start):.0f} ms",
        flush=True,
    )
    for page in pages + [leader]:
        page.close()


class SocketFollower:
    """A follower without a browser: a Streamlit session over a websocket that asks for the page at `query` (as a
    browser's first message does) and records when each message from the server arrived. It draws nothing."""

    def __init__(self, url: str, query: str):
        self.frames: list[tuple[float, bytes]] = []
        self._lock = threading.Lock()
        opening = BackMsg()
        opening.rerun_script.query_string = query
        self._socket = connect(
            f"ws://{urlsplit(url).netloc}/_stcore/stream", subprotocols=["streamlit"], max_size=None, legacy=True
        )  # closed by `close`, not a with block
        self._socket.send(opening.SerializeToString())
        threading.Thread(target=self._receive, daemon=True).start()

    def _receive(self) -> None:
        try:
            for data in self._socket:
                with self._lock:
                    self.frames.append((time.perf_counter(), data))
        except Exception:  # noqa: BLE001 — closed at the end of the bench
            pass

    def sent_after(self, start: float, text: str) -> float | None:
        """When a message from `start` on first carried `text`."""
        with self._lock:
            return first_carrying(self.frames, text, start)

    def close(self) -> None:
        self._socket.close()


def leader_press(leader) -> float:
    """→ on the leader's page until its counter moved, in ms."""
    before = counter(leader)
    start = time.perf_counter()
    leader.keyboard.press("ArrowRight")
    leader.wait_for_function(
        f"() => document.querySelector('.kv-counter')?.textContent !== {before!r}", timeout=WAIT_MS, polling="raf"
    )
    return 1000 * (time.perf_counter() - start)


def socket_followers(browser, url: str, count: int, presses: int, server) -> None:
    """A leader page and `count` `SocketFollower`s: per press, the leader's own → until its counter moved, until the
    server had sent the new counter to the first, the median and the last follower, and the server's CPU time
    from the press until the last was sent (alone: until its run ended), against the leader's alone."""
    leader = browser.new_page(viewport={"width": 1280, "height": 720})
    leader.goto(f"{url}/?lead=1&step=1")
    settled_text(leader)
    link = leader.locator(".st-key-follow-link a").get_attribute("href")
    leader.locator("h1").first.click()
    alone, alone_cpu = [], []  # the same leader with nobody following yet
    for _ in range(presses):
        before = cpu_seconds(server)
        alone.append(leader_press(leader))
        leader.wait_for_function(IDLE, timeout=WAIT_MS)
        alone_cpu.append(1000 * (cpu_seconds(server) - before))
        time.sleep(1.0)
    target = counter(leader)
    followers = []
    for _ in range(count):
        followers.append(SocketFollower(url, urlsplit(link).query))
        deadline = time.perf_counter() + WAIT_MS / 1000  # one after another, as the browser bench opens them
        while followers[-1].sent_after(0, 'kv-counter">' + html.escape(target)) is None:
            assert time.perf_counter() < deadline, "a follower never showed the leader's step"
            time.sleep(0.05)
    time.sleep(2.0)
    leader.locator("h1").first.click()
    own, first, middle, last, cpu = [], [], [], [], []
    for _ in range(presses):
        before = cpu_seconds(server)
        start = time.perf_counter()
        own.append(leader_press(leader))
        marker = 'kv-counter">' + html.escape(counter(leader))
        deadline = start + WAIT_MS / 1000
        while (arrivals := [f.sent_after(start, marker) for f in followers]).count(None):
            assert time.perf_counter() < deadline, "a follower was never sent the leader's step"
            time.sleep(0.02)
        cpu.append(1000 * (cpu_seconds(server) - before))
        arrivals = sorted(1000 * (at - start) for at in arrivals)
        first.append(arrivals[0])
        middle.append(statistics.median(arrivals))
        last.append(arrivals[-1])
        leader.wait_for_function(IDLE, timeout=WAIT_MS)
        time.sleep(2.0)  # the followers' runs end too
    per_follower = (statistics.median(cpu) - statistics.median(alone_cpu)) / count
    print(
        f"  leader alone → {spread(alone)}; with {count} socket followers: leader's own → {spread(own)} "
        f"({statistics.median(own) / statistics.median(alone):.2f} × alone); the step sent to the first follower "
        f"{spread(first)}, the median one {spread(middle)}, the last {spread(last)}; the server's CPU a press "
        f"{statistics.median(alone_cpu):.0f} ms alone, {statistics.median(cpu):.0f} ms with them "
        f"({per_follower:.1f} ms a follower)",
        flush=True,
    )
    for follower in followers:
        follower.close()
    leader.close()


def play(browser, url: str, tokens: int = 60) -> None:
    """Play at the fastest pace the host allows (0.3 s a token): tokens shown ÷ time, against the pace."""
    page = browser.new_page(viewport={"width": 1280, "height": 720})
    page.goto(f"{url}/?step=1&temperature=1&seed=3")
    settled_text(page)
    thumb = page.locator('.st-key-p_pace input[type="range"]')
    thumb.focus()
    while float(thumb.evaluate("el => el.value")) > 0.3 + 1e-9:
        thumb.press("ArrowLeft")
        page.wait_for_timeout(100)
    page.wait_for_function(IDLE, timeout=WAIT_MS)
    page.locator(".st-key-p_playing label").first.click()
    step = lambda: int(page.evaluate("() => new URL(location.href).searchParams.get('step') ?? '0'"))  # noqa: E731
    page.wait_for_function("() => Number(new URL(location.href).searchParams.get('step')) >= 2", timeout=WAIT_MS)
    first, start = step(), time.perf_counter()
    page.wait_for_function(
        f"() => Number(new URL(location.href).searchParams.get('step')) >= {first + tokens}",
        timeout=WAIT_MS,
        polling="raf",
    )
    elapsed = time.perf_counter() - start
    rate = tokens / elapsed
    print(
        f"  Play at 0.3 s: {tokens} tokens in {elapsed:.1f} s = {rate:.2f} tokens/s ({rate * 0.3:.2f} × the pace)",
        flush=True,
    )
    page.close()


def measure(root: Path, args) -> None:
    print(f"app of {root}", flush=True)
    with running_server(Path("/tmp/kvscope-latency-server.log"), root=root) as (url, process):
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            if "worst" in args.parts:
                worst(browser, url, args.presses)
                print(f"  server's peak RSS {peak_rss_mb(process):.0f} MB", flush=True)
            if "views" in args.parts:
                views(browser, url, args.presses, args.warm)
            if "switch" in args.parts:
                switch(browser, url)
            if "chapters" in args.parts:
                chapters(browser, url)
            if "play" in args.parts:
                play(browser, url)
            if "follow" in args.parts and args.followers:
                followers(browser, url, args.followers, args.presses)
            if "sockets" in args.parts and args.followers:
                socket_followers(browser, url, args.followers, args.presses, psutil.Process(process.pid))
            browser.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--presses", type=int, default=6)
    parser.add_argument("--warm", type=int, default=2)
    parser.add_argument("--followers", type=int, default=3)
    parser.add_argument("--parts", default="views,switch,chapters,play,follow")
    parser.add_argument("--before", type=Path, help="another checkout to measure first, in the same run")
    args = parser.parse_args()
    for root in ([args.before] if args.before else []) + [ROOT]:
        measure(root.resolve(), args)


if __name__ == "__main__":
    main()

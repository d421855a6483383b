"""A real Streamlit server on loopback for the browser and load tests."""

import contextlib
import os
import re
import select
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import weakref
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"  # Debian's package; .ci/run installs it
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
START_SECONDS = 240  # a harness timeout for a server's start (torch imported on a loaded 2-core machine): a hung one


_open: list = []  # the Chromium a `chromium()` further out in this process holds open


@contextlib.contextmanager
def chromium():
    """Headless Debian Chromium (Playwright's sync API): the browser every browser test drives. Inside another
    `chromium()` (the test session's, conftest.py's `browser`) it is that one: the sync API allows one Playwright
    per thread, and a browser per test would cost its start."""
    if _open:
        yield _open[-1]
        return
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        _open.append(browser)
        try:
            yield browser
        finally:
            _open.remove(browser)
            browser.close()


@contextlib.contextmanager
def browser_page(width: int = 1280, height: int = 720, **options):
    """One page in a fresh context (its own cookies: its own session) at `width` × `height` (options go to
    `new_context`)."""
    with chromium() as browser:
        context = browser.new_context(viewport={"width": width, "height": height}, **options)
        try:
            yield context.new_page()
        finally:
            context.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(log_path: Path, env: dict | None = None, root: Path = ROOT, address: str = "127.0.0.1"):
    """Start `streamlit run app.py` (of the checkout at `root`) on a free port, listening on `address` (loopback;
    "0.0.0.0": every interface, as a class's server does, though tests connect to loopback only); yield (url,
    process); stop it after."""
    port = free_port()
    process = launch(port, log_path, env, root, address)
    try:
        yield wait_until_healthy(port, process, log_path), process
    finally:
        stop(process)


@contextlib.contextmanager
def restarted_server(url: str, process: subprocess.Popen, log_path: Path, env: dict | None = None):
    """Stop the server behind `url` and start a new one on the same port (a deploy, a crash and restart);
    yield the new process; stop it after. Open pages keep their URL and reconnect to the new server."""
    stop(process)
    port = int(url.rsplit(":", 1)[1])
    new = launch(port, log_path, env)
    try:
        wait_until_healthy(port, new, log_path)
        yield new
    finally:
        stop(new)


def launch(
    port: int, log_path: Path, env: dict | None = None, root: Path = ROOT, address: str = "127.0.0.1"
) -> subprocess.Popen:
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    entry = root / "serve.py" if (root / "serve.py").exists() else root / "app.py"  # an older checkout: app.py
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            str(entry),
            "--server.port",
            str(port),
            "--server.address",
            address,
            "--browser.serverAddress",
            "127.0.0.1",  # its URL: no lookup of an external IP
            "--server.headless",
            "true",
            "--browser.gatherUsageStats",
            "false",
        ],
        cwd=root,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    _outputs[process] = Output(process, log_path)
    return process


class Output:
    """A process's output (stdout, with stderr if sent there), copied to `log_path` as it comes by a thread of its
    own, and kept as lines: a test waits for a line the process prints (it is ready, it started something) rather
    than polling for what follows from it."""

    def __init__(self, process: subprocess.Popen, log_path: Path):
        self.lines: list[str] = []
        self.ended = False  # the process closed its output: it has exited
        self._changed = threading.Condition()
        threading.Thread(target=self._copy, args=(process.stdout, log_path), daemon=True).start()

    def _copy(self, stream, log_path: Path) -> None:
        tail = b""
        with open(log_path, "wb") as log:
            while chunk := os.read(stream.fileno(), 65536):  # as it comes: the log is never behind by a line
                log.write(chunk)
                log.flush()
                *complete, tail = (tail + chunk).split(b"\n")
                self._add([line.decode(errors="replace") for line in complete])
        stream.close()
        self._add([tail.decode(errors="replace")] if tail else [], ended=True)

    def _add(self, lines: list[str], ended: bool = False) -> None:
        with self._changed:
            self.lines += lines
            self.ended = ended
            self._changed.notify_all()

    def wait_for(self, pattern: str, start: int = 0, seconds: float = START_SECONDS) -> tuple[int, re.Match]:
        """The first line from line `start` on that `pattern` matches (re.search), and its index. Fails if the
        output ends without one, or after `seconds` (a harness timeout: only keeps a hung test from hanging)."""
        found = None

        def seen() -> bool:
            nonlocal found
            found = next(
                ((i, m) for i in range(start, len(self.lines)) if (m := re.search(pattern, self.lines[i]))), None
            )
            return found is not None or self.ended

        with self._changed:
            if not self._changed.wait_for(seen, seconds):
                raise RuntimeError(f"no line matching {pattern!r} within {seconds} s; printed: {self.lines[-20:]}")
        if found is None:
            raise RuntimeError(f"the process exited without a line matching {pattern!r}; printed: {self.lines[-20:]}")
        return found


_outputs: "weakref.WeakKeyDictionary[subprocess.Popen, Output]" = weakref.WeakKeyDictionary()  # `launch`'s


def wait_until_healthy(port: int, process: subprocess.Popen, log_path: Path) -> str:
    """The server's URL once it has said it serves there (its "URL:" line; for a process not started by `launch`,
    once its port takes connections) and then answered its health check."""
    url = f"http://127.0.0.1:{port}"
    output = _outputs.get(process)
    try:
        if output is not None:
            output.wait_for(r"URL: " + re.escape(url) + r"\b")  # printed once it listens
        else:
            wait_until_listening(port, process.pid)
        with urllib.request.urlopen(url + "/_stcore/health", timeout=START_SECONDS) as response:
            assert response.status == 200, response.status  # answered once its runtime is up
    except (RuntimeError, OSError) as error:
        raise RuntimeError(f"the Streamlit server did not start ({error}); see {log_path}") from None
    return url


def wait_until_listening(port: int, pid: int, seconds: float = START_SECONDS) -> None:
    """Wait until loopback `port` takes connections, which process `pid` is starting to listen on. A refused try is
    tried again once the process has had a moment (`select` on its pidfd: cut short if it exits, then a failure);
    `seconds` is a harness timeout."""
    exits = os.pidfd_open(pid)
    try:
        deadline = time.monotonic() + seconds
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=seconds).close()
                return
            except ConnectionRefusedError:
                if select.select([exits], [], [], 0.05)[0]:
                    raise RuntimeError(f"process {pid} exited before it listened on port {port}") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"nothing listened on port {port} within {seconds} s") from None
    finally:
        os.close(exits)


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def settled_text(page) -> str:
    """Wait for the script run that draws the text container to finish, then read it (sync Playwright page). In
    this order: a page just opened is "notRunning" before its first run starts."""
    page.wait_for_selector(".st-key-generated code", timeout=120_000)
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=120_000)
    return page.eval_on_selector(".st-key-generated code", "el => el.textContent")

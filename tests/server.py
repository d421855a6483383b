"""A real Streamlit server on loopback for the browser and load tests."""

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"  # Debian's package; .ci/run installs it
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


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
def running_server(log_path: Path, env: dict | None = None, root: Path = ROOT):
    """Start `streamlit run app.py` (of the checkout at `root`) on a free loopback port; yield (url, process);
    stop it after."""
    port = free_port()
    process = launch(port, log_path, env, root)
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


def launch(port: int, log_path: Path, env: dict | None = None, root: Path = ROOT) -> subprocess.Popen:
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    entry = root / "serve.py" if (root / "serve.py").exists() else root / "app.py"  # an older checkout: app.py
    with open(log_path, "w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", str(entry), "--server.port", str(port),
             "--server.address", "127.0.0.1", "--server.headless", "true", "--browser.gatherUsageStats", "false"],
            cwd=root, env=environment, stdout=log, stderr=subprocess.STDOUT)


def wait_until_healthy(port: int, process: subprocess.Popen, log_path: Path) -> str:
    """The server's URL once it answers its health check (within two minutes)."""
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while True:
        try:
            if urllib.request.urlopen(url + "/_stcore/health", timeout=2).status == 200:
                return url
        except OSError:
            if time.time() > deadline or process.poll() is not None:
                raise RuntimeError("the Streamlit server did not start; see " + str(log_path))
            time.sleep(0.5)


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

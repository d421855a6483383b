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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(log_path: Path, env: dict | None = None):
    """Start `streamlit run app.py` on a free loopback port; yield (url, process); stop it after."""
    port = free_port()
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"), "--server.port", str(port),
             "--server.address", "127.0.0.1", "--server.headless", "true", "--browser.gatherUsageStats", "false"],
            cwd=ROOT, env=environment, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.time() + 120
            while True:
                try:
                    if urllib.request.urlopen(url + "/_stcore/health", timeout=2).status == 200:
                        break
                except OSError:
                    if time.time() > deadline or process.poll() is not None:
                        raise RuntimeError("the Streamlit server did not start; see " + str(log_path))
                    time.sleep(0.5)
            yield url, process
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def settled_text(page) -> str:
    """Wait for the script run to finish, then read the text container (sync Playwright page)."""
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=120_000)
    page.wait_for_selector(".st-key-generated code", timeout=120_000)
    return page.eval_on_selector(".st-key-generated code", "el => el.textContent")

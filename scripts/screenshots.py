"""Screenshots of every view, English and Chinese, at 1600×1000, from a running server.

    HF_HUB_OFFLINE=1 streamlit run app.py --server.port 8599 &
    python scripts/screenshots.py http://localhost:8599 /tmp/kvscope-shots

Needs Debian's chromium and the playwright package (see .ci/run).
"""

import sys
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

VIEWS = ("flow", "attention", "kv", "split", "prefix", "costs")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]


def main(base: str, folder: str) -> None:
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        for lang in ("en", "zh"):
            for view in VIEWS:
                page.goto(f"{base}/?step=8&view={view}&lang={lang}&kv_splits=3&block_size=4&layer=5&head=2")
                page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=120_000)
                page.wait_for_selector(".st-key-generated code", timeout=120_000)
                time.sleep(2)  # let Plotly finish drawing
                page.get_by_role("heading", level=3).first.scroll_into_view_if_needed()
                page.screenshot(path=str(out / f"{view}-{lang}.png"))
                print(out / f"{view}-{lang}.png")
        browser.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

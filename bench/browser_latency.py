"""Time from the Right arrow to the next token's text on screen, in headless Chromium, on the embedded model.

    python bench/browser_latency.py [--presses 20]

Starts its own server (limits raised so a ~2,000-token prompt fits), opens a link with about 200 and
then about 2,000 cached tokens, presses Right repeatedly and reports the median and 90th percentile
from key press to the new text in the `generated` container; also the server's resident memory
before and after, and over 500 steps of one session. Run by hand, not in CI.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

from tests.server import CHROMIUM, CHROMIUM_ARGS, running_server, settled_text  # noqa: E402

TEXT = '() => document.querySelector(".st-key-generated code")?.textContent ?? ""'


def rss_mib(pid: int) -> float:
    process = psutil.Process(pid)
    return (process.memory_info().rss + sum(c.memory_info().rss for c in process.children(True))) / 2**20


def press_and_time(page, presses: int) -> list[float]:
    times = []
    page.locator("h1").first.click()
    for _ in range(presses):
        before = page.evaluate(TEXT)
        start = time.perf_counter()
        page.keyboard.press("ArrowRight")
        page.wait_for_function(f"(before) => ({TEXT})() !== before", arg=before, timeout=120_000, polling=5)
        times.append(1000 * (time.perf_counter() - start))
        settled_text(page)  # let the rest of the step (the view) finish before the next press
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--presses", type=int, default=20)
    parser.add_argument("--view", default="flow")
    args = parser.parse_args()
    env = {"KVSCOPE_MAX_PROMPT_TOKENS": "2100", "KVSCOPE_MAX_NEW_TOKENS": "600", "KVSCOPE_CACHE_TOKENS": "2800"}
    with running_server(Path("/tmp/kvscope-latency-server.log"), env) as (url, process):
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            for words in (190, 1990):  # about one token per word, plus the chat template
                prompt = " ".join(["token"] * words)
                page.goto(f"{url}/?prompt={quote(prompt)}&chat=0&step=1&view={args.view}&temperature=1&seed=3")
                settled_text(page)
                times = press_and_time(page, args.presses)
                times.sort()
                print(f"~{words} cached tokens, view={args.view}: median {statistics.median(times):.0f} ms, "
                      f"p90 {times[int(0.9 * len(times)) - 1]:.0f} ms over {len(times)} presses; "
                      f"server RSS {rss_mib(process.pid):.0f} MiB")
            page.goto(f"{url}/?prompt={quote('Once upon a time')}&chat=0&step=1&view={args.view}"
                      "&temperature=1.2&seed=5")
            settled_text(page)
            page.locator("h1").first.click()
            readings = [f"step 1: {rss_mib(process.pid):.0f} MiB"]
            for step in range(2, 501):
                page.keyboard.press("ArrowRight")
                try:
                    page.wait_for_function(f"() => new URL(location.href).searchParams.get('step') === '{step}'",
                                           timeout=60_000)
                except Exception:  # noqa: BLE001 — the run ended (end-of-sequence): report how far it got
                    readings.append(f"ended before step {step}")
                    break
                if step % 100 == 0:
                    settled_text(page)
                    readings.append(f"step {step}: {rss_mib(process.pid):.0f} MiB")
            print("server RSS over one long run: " + ", ".join(readings))
            browser.close()


if __name__ == "__main__":
    main()

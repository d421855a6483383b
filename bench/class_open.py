"""A class opening the teacher's link at once: time until the last of N pages is ready, against one page alone.

    python bench/class_open.py [--pages 10] [--step 48]

Starts its own server and loads the model (a first page, not timed). Then, in the same run: one page alone
opens a `step=48` link; then N pages (each its own browser context, so its own session) open another link at
the same moment (another seed, so nothing computed for the single page is reused). A page is ready when its
script run has finished, the link says the step and its live Next button is drawn. Prints each time and the ratio.
Run by hand, not in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from playwright.async_api import async_playwright  # noqa: E402

from tests.server import CHROMIUM, CHROMIUM_ARGS, running_server  # noqa: E402

PROMPT = "Explain what a KV cache is, in one paragraph."


def link(url: str, step: int, seed: int) -> str:
    return f"{url}/?prompt={quote(PROMPT)}&chat=1&step={step}&seed={seed}&temperature=0.8&view=flow"


async def open_until_ready(browser, address: str, step: int) -> float:
    """Seconds from opening `address` in a fresh context until the page shows `step` with its buttons live."""
    context = await browser.new_context(viewport={"width": 1280, "height": 720})
    page = await context.new_page()
    started = time.perf_counter()
    await page.goto(address, wait_until="domcontentloaded")
    await page.wait_for_function(
        """(step) => document.querySelector('[data-testid=stApp]')?.getAttribute('data-test-script-state')
               === 'notRunning'
           && Number(new URL(location.href).searchParams.get('step')) === step
           && document.querySelector('.st-key-b_next button:not([disabled])') !== null""",
        arg=step, timeout=900_000, polling=50)
    seconds = time.perf_counter() - started
    await context.close()
    return seconds


async def measure(url: str, pages: int, step: int) -> tuple[float, list[float]]:
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            await open_until_ready(browser, link(url, 1, seed=0), 1)  # loads and warms the model: not timed
            alone = await open_until_ready(browser, link(url, step, seed=1), step)
            together = await asyncio.gather(*(open_until_ready(browser, link(url, step, seed=2), step)
                                              for _ in range(pages)))
            return alone, sorted(together)
        finally:
            await browser.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pages", type=int, default=10)
    parser.add_argument("--step", type=int, default=48)
    args = parser.parse_args()
    with running_server(Path("/tmp/kvscope-class-open.log")) as (url, _):
        alone, together = asyncio.run(measure(url, args.pages, args.step))
    print(f"one page alone, step={args.step}: ready in {alone:.1f} s")
    print(f"{args.pages} pages at once: first ready in {together[0]:.1f} s, median {together[len(together) // 2]:.1f} s, "
          f"last {together[-1]:.1f} s")
    print(f"last of {args.pages} ÷ alone: {together[-1] / alone:.1f}×")


if __name__ == "__main__":
    main()

"""A class opening the teacher's link at once: time until the last of N pages is ready, against one page alone.

    python bench/class_open.py [--pages 10] [--step 48]

Starts its own server and loads the model (a first page, not timed). Then, in the same run: one page alone
opens a `step=48` link; then N pages (each its own browser context, so its own session) open another link at
the same moment (another seed, so nothing computed for the single page is reused; greedy, so both answers are
the same 87 tokens and the work is the same). A page is ready when its
script run has finished, the link says its step and its live Back button is drawn. Prints each time and the ratio.
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

import psutil  # noqa: E402
from playwright.async_api import async_playwright  # noqa: E402

from tests.server import CHROMIUM, CHROMIUM_ARGS, running_server  # noqa: E402

PROMPT = "Explain what a KV cache is, in one paragraph."


def link(url: str, step: int, seed: int) -> str:
    return f"{url}/?prompt={quote(PROMPT)}&chat=1&step={step}&seed={seed}&temperature=0&view=flow"


async def open_until_ready(browser, address: str) -> float:
    """Seconds from opening `address` in a fresh context until the page shows its step with its buttons live."""
    context = await browser.new_context(viewport={"width": 1280, "height": 720})
    page = await context.new_page()
    started = time.perf_counter()
    await page.goto(address, wait_until="domcontentloaded")
    # The Back button is live once the step is drawn (greyed while a run computes and draws; Next stays greyed
    # at the end of an answer shorter than `step`).
    await page.wait_for_function(
        """() => document.querySelector('[data-testid=stApp]')?.getAttribute('data-test-script-state')
               === 'notRunning'
           && new URL(location.href).searchParams.has('step')
           && document.querySelector('.st-key-b_back button:not([disabled])') !== null""",
        timeout=900_000,
        polling=50,
    )
    seconds = time.perf_counter() - started
    await context.close()
    return seconds


def cpu_seconds(process: psutil.Process) -> float:
    """User + system CPU seconds of `process` so far."""
    times = process.cpu_times()
    return times.user + times.system


def machine_cpu_seconds() -> float:
    """Busy CPU seconds of the whole machine so far (all cores): the server, the browsers and anything else."""
    times = psutil.cpu_times()
    return times.user + times.nice + times.system + times.irq + times.softirq


class CpuSplit:
    """CPU seconds the server and everything else (the browsers, on a quiet machine) used during a `with` block:
    here both share the machine's cores, while in a class each student's browser runs on the student's own
    device. (Chromium's renderers exit with their pages, taking their own counters with them: hence the
    machine's total minus the server's.)"""

    def __init__(self, server: psutil.Process):
        self.server = server

    def __enter__(self):
        self.start = cpu_seconds(self.server), machine_cpu_seconds()
        return self

    def __exit__(self, *exc):
        server = cpu_seconds(self.server) - self.start[0]
        self.used = (server, machine_cpu_seconds() - self.start[1] - server)


async def measure(url: str, server: psutil.Process, pages: int, step: int) -> dict:
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            await open_until_ready(browser, link(url, 1, seed=0))  # loads and warms the model: not timed
            with CpuSplit(server) as alone_cpu:
                alone = await open_until_ready(browser, link(url, step, seed=1))
            with CpuSplit(server) as together_cpu:
                together = await asyncio.gather(
                    *(open_until_ready(browser, link(url, step, seed=2)) for _ in range(pages))
                )
            return {
                "alone": alone,
                "together": sorted(together),
                "alone_cpu": alone_cpu.used,
                "together_cpu": together_cpu.used,
            }
        finally:
            await browser.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pages", type=int, default=10)
    parser.add_argument("--step", type=int, default=48)
    args = parser.parse_args()
    with running_server(Path("/tmp/kvscope-class-open.log")) as (url, process):
        result = asyncio.run(measure(url, psutil.Process(process.pid), args.pages, args.step))
    alone, together = result["alone"], result["together"]
    print(
        f"one page alone, step={args.step}: ready in {alone:.1f} s "
        f"(CPU: server {result['alone_cpu'][0]:.1f} s, the rest {result['alone_cpu'][1]:.1f} s)"
    )
    print(
        f"{args.pages} pages at once: first ready in {together[0]:.1f} s, "
        f"median {together[len(together) // 2]:.1f} s, "
        f"last {together[-1]:.1f} s (CPU: server {result['together_cpu'][0]:.1f} s, "
        f"the rest {result['together_cpu'][1]:.1f} s)"
    )
    print(
        f"server CPU, {args.pages} pages ÷ one: {result['together_cpu'][0] / result['alone_cpu'][0]:.1f}×; "
        f"machine: {psutil.cpu_count()} cores"
    )
    print(f"last of {args.pages} ÷ alone: {together[-1] / alone:.1f}×")


if __name__ == "__main__":
    main()

"""The teacher's press with the room store healthy, hung and down; followers' lag when it comes back. Headless
Chromium, the embedded model, a real redis-server (KVSCOPE_STORE) that is paused (SIGSTOP) and stopped.

    python bench/store_faults.py [--presses 4]

One teacher page and two follower pages. Each of `--presses` rounds: the teacher presses → with Redis healthy;
Redis is paused and, once every page says so, the teacher presses →; Redis resumes (SIGCONT); Redis is stopped
and, once every page says so, the teacher presses →; Redis starts again, empty, on the same port. A press is timed
from the click until the teacher's page shows the new step with its run finished; a return, from SIGCONT or the
new Redis answering until both followers show the teacher's step (moved during the outage), with no click (and,
as a baseline, from the end of a healthy press until both show it). The
rounds interleave the three states so that a shared machine's changing load falls on all of them alike. Run by
hand, not in CI; say how loaded the machine was.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from playwright.sync_api import expect  # noqa: E402

from tests.redis_server import redis_process  # noqa: E402
from tests.server import chromium, running_server  # noqa: E402
from tests.test_follow_browser import shows  # noqa: E402
from tests.test_follow_faults import DOWN, LEAD_DOWN, open_class, timed_next  # noqa: E402

WAIT_MS = 120_000


def told(pages) -> None:
    for page, says in zip(pages, (LEAD_DOWN, DOWN, DOWN)):
        expect(page.get_by_text(says)).to_be_visible(timeout=WAIT_MS)


def back(followers, now: dict) -> float:
    """Seconds until every follower shows `now`."""
    started = time.perf_counter()
    for follower in followers:
        shows(follower, now, timeout_ms=WAIT_MS)
    return time.perf_counter() - started


def summary(name: str, times: list[float]) -> str:
    return f"{name}: median {statistics.median(times):.2f} s, max {max(times):.2f} s ({len(times)})"


def rounds(leader, followers, url: str, store, folder: Path, count: int) -> dict[str, list[float]]:
    """`count` rounds of: a press with Redis healthy, one with it paused, Redis resumed, one with it stopped,
    Redis started again empty (interleaved, so that the machine's changing load falls on all three alike)."""
    pages, port = [leader, *followers], int(url.rsplit(":", 1)[1].split("/")[0])
    names = ("healthy", "hung", "down", "followed", "resumed", "restarted")
    times: dict[str, list[float]] = {name: [] for name in names}
    step = 3
    with contextlib.ExitStack() as stack:
        for _ in range(count):
            seconds, now = timed_next(leader, step)
            times["healthy"].append(seconds)
            times["followed"].append(back(followers, now))
            os.kill(store.pid, signal.SIGSTOP)
            told(pages)
            seconds, now = timed_next(leader, step + 1)
            times["hung"].append(seconds)
            os.kill(store.pid, signal.SIGCONT)
            times["resumed"].append(back(followers, now))
            store.terminate()
            store.wait()
            told(pages)
            seconds, now = timed_next(leader, step + 2)
            times["down"].append(seconds)
            _, store = stack.enter_context(redis_process(folder, port=port))
            times["restarted"].append(back(followers, now))
            step += 3
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--presses", type=int, default=4)
    count = parser.parse_args().presses
    with tempfile.TemporaryDirectory() as folder, chromium() as browser:
        folder = Path(folder)
        leader, *followers = [browser.new_context(viewport={"width": 1280, "height": 720}).new_page() for _ in range(3)]
        with (
            redis_process(folder) as (url, store),
            running_server(folder / "log.txt", env={"KVSCOPE_STORE": url}) as (server, _),
        ):
            open_class(server, leader, followers)
            timed_next(leader, 2)  # warm-up
            times = rounds(leader, followers, url, store, folder, count)
    for name in ("healthy", "hung", "down"):
        print(summary(f"{name:8} press → step drawn", times[name]))
    print(summary("followers in step after a healthy press (the baseline)", times["followed"]))
    print(summary("followers in step after Redis resumes (SIGCONT)", times["resumed"]))
    print(summary("followers in step after Redis restarts empty", times["restarted"]))


if __name__ == "__main__":
    main()

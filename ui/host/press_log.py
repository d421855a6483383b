"""Where a page's press spends its time: a record for bench/class_on_host.py, kept only when the server's environment
names a file in KVSCOPE_PRESS_LOG (off otherwise: one check of a constant per stretch).

Each line of the file is one timed stretch of one browser session's work, as JSON:
`{"session": id, "part": name, "at": start, "seconds": length}` (`at` on the machine's monotonic clock, which the
bench reads too). The parts (`PARTS`):
- "turn": waiting for a turn of its role (ui/runs/turns.py): the first take, and each take back after sharing;
- "run lock": waiting while another page steps the same shared run (`turns.TurnLock`);
- "engine": decoding: a run's prefill and steps, an eviction lab's batched steps (turns shared inside included);
- "figures": building a view's figures and tables for the pages that show them (ui/views/figures.py);
- "turn held": holding a turn, from taking it to giving it back (what the pages waiting for one wait behind).
The bench adds a press's stretches up between the press being sent and its run ending; what is left is the page's
other work (Streamlit's elements, the paint gap, sending).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ui.host.streamlit_internals import current_session_id

PARTS = ("turn", "run lock", "engine", "figures", "turn held")
PATH = os.environ.get("KVSCOPE_PRESS_LOG") or None
clock = time.perf_counter  # CLOCK_MONOTONIC on Linux: one clock for the server and the bench

_lock = threading.Lock()


def record(part: str, at: float, seconds: float, path: str | None = None) -> None:
    """Append one stretch of the current browser session's work to the file at `path` (default: the environment's);
    nothing without a file."""
    path = path or PATH
    if path is None:
        return
    if part not in PARTS:
        raise ValueError(f"a press's part is one of {PARTS}, not {part!r}")
    line = json.dumps({"session": current_session_id(), "part": part, "at": at, "seconds": seconds})
    with _lock, open(path, "a", encoding="utf-8") as out:
        out.write(line + "\n")


@contextmanager
def timed(part: str) -> Iterator[None]:
    """Record how long the block took as `part` (nothing when no file is named)."""
    if PATH is None:
        yield
        return
    start = clock()
    try:
        yield
    finally:
        record(part, start, clock() - start)


@contextmanager
def held(lock) -> Iterator[None]:
    """Hold `lock` for the block; a wait for it (another page holds it) is recorded as "run lock"."""
    if not lock.acquire(blocking=False):
        with timed("run lock"):
            lock.acquire()
    try:
        yield
    finally:
        lock.release()

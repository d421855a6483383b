"""The `RunStore`: runs that pages with the same settings and prompt history share, bounded in bytes, handed out as
leases (`ui.runs.run.Lease`).

Plain Python (no Streamlit).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from ui.runs.run import Lease, Run, RunBuilder, RunConfig, RunKey, Seeds

# A run no page has asked for this long is dropped from the store: a class that left (tabs closed) hands its runs
# back within minutes instead of holding them until the store fills. A page reads its run on every press, and a
# page left open keeps the run it holds.
IDLE_SECONDS = 300


class RunStore:
    """The runs of one model that pages share: least recently used first, bounded in bytes (`max_bytes`).

    A run is built once per key, under a lock of that key (pages asking at once wait for the one build). A page
    keeps the run it reads even after the store dropped it; the store only stops handing it out.
    """

    def __init__(self, max_bytes: int, idle_seconds: float = IDLE_SECONDS, clock: Callable[[], float] = time.monotonic):
        self.max_bytes = max_bytes
        self.idle_seconds = idle_seconds
        self.built = 0  # runs built so far
        self._clock = clock
        self._lock = threading.Lock()  # guards the three dicts below
        self._runs: OrderedDict[RunKey, Run] = OrderedDict()
        self._read_at: dict[RunKey, float] = {}
        self._building: dict[RunKey, threading.Lock] = {}

    def get(self, key: RunKey, build: Callable[[], Run]) -> Run:
        with self._lock:
            building = self._building.setdefault(key, threading.Lock())
        try:
            with building:
                with self._lock:
                    run = self._runs.get(key)
                    if run is not None:
                        self._runs.move_to_end(key)
                        self._read_at[key] = self._clock()
                        return run
                run = build()  # may raise (a prompt too long): nothing is stored
                with self._lock:
                    self._runs[key] = run
                    self._read_at[key] = self._clock()
                    self.built += 1
        finally:
            with self._lock:  # a key's build lock lives while it is asked for, not for every key ever read
                if self._building.get(key) is building and not building.locked():
                    del self._building[key]
        self.trim()
        return run

    def trim(self) -> None:
        """Drop the least recently used runs until the others fit in `max_bytes` (the newest always stays)."""
        with self._lock:
            runs = list(self._runs.items())
        sizes = {key: run.nbytes for key, run in runs}  # outside the store's lock: a run's size reads its pool
        total = sum(sizes.values())
        with self._lock:
            for key, _ in runs[:-1]:
                if total <= self.max_bytes:
                    break
                if self._runs.pop(key, None) is not None:
                    self._read_at.pop(key, None)
                    total -= sizes[key]

    def lease(self, config: RunConfig, seeds: Seeds, build: RunBuilder) -> Lease:
        return StoreLease(self, self.get((config, seeds), lambda: build(seeds=seeds)))

    def touch(self, run: Run) -> None:
        """`run` was read by a page that holds it: it is not idle (a no-op once the store dropped it)."""
        with self._lock:
            for key in self._read_at:
                if self._runs[key] is run:
                    self._read_at[key] = self._clock()
                    return

    def expire(self) -> int:
        """Drop the runs no page has asked for in `idle_seconds` (the pages of closed tabs; a page still open keeps
        the run it reads); returns how many were dropped. Called every so often by the server's sweeper."""
        cutoff = self._clock() - self.idle_seconds
        with self._lock:
            idle = [key for key, read_at in self._read_at.items() if read_at <= cutoff]
            for key in idle:
                del self._runs[key], self._read_at[key]
        return len(idle)

    @property
    def keys(self) -> list[RunKey]:
        """The keys of the runs kept, least recently used first."""
        with self._lock:
            return list(self._runs)


class StoreLease(Lease):
    """A page's hold on a run of the store: reading it keeps it from going idle; stepping it may push older runs
    out. Releasing it leaves the run to the other pages reading it."""

    def __init__(self, store: RunStore, run: Run):
        super().__init__(run)
        self._store = store

    def renew(self) -> None:
        self._store.touch(self.run)

    def grown(self) -> None:
        self._store.trim()

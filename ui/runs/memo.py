"""`Memo`: a small least-recently-used memo that a server's pages read and fill at once (a run's rebuilt steps and
heatmaps, the views' figures and tables)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from cachetools import LRUCache


class Memo:
    """A least-recently-used memo of `size` values that pages may read while others add to it (the store sizes runs
    without their locks)."""

    def __init__(self, size: int):
        self._values: LRUCache = LRUCache(size)
        self._lock = threading.Lock()

    def get(self, key):
        with self._lock:
            return self._values.get(key)  # a hit counts as a use

    def put(self, key, value):
        with self._lock:
            self._values[key] = value
        return value

    def made(self, key, build: Callable):
        """The value kept under `key`, or `build()`'s, kept (built outside the lock: pages asking at once may each
        build it, and one is kept)."""
        value = self.get(key)
        return self.put(key, build()) if value is None else value

    def values(self) -> list:
        with self._lock:
            return list(self._values.values())

    def clear(self) -> None:
        with self._lock:
            self._values.clear()

"""Wall-clock time of a step's parts, in milliseconds, as a trace reports them."""

from __future__ import annotations

import time


class Stopwatch:
    """Started when made; each `lap` times the part since the previous lap (or the start)."""

    def __init__(self):
        self._start = self._last = time.perf_counter()
        self._laps: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self._laps[name] = 1000 * (now - self._last)
        self._last = now

    def timings_ms(self) -> dict[str, float]:
        """Every lap so far, and "total": the time since the start."""
        return {**self._laps, "total": 1000 * (time.perf_counter() - self._start)}

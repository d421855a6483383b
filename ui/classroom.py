"""The class's shared prefix cache, when the host turns it on (KVSCOPE_SHARED_PREFIX_CACHE): one pool per
(policy, block size) that every student's run uses, with its blocks brought back from students who left.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import engine
from ui.settings import Limits

if TYPE_CHECKING:
    from ui.runner import Runner

CLASSROOM_CACHES = 3  # (policy, block size) pools a class keeps; the least recently used is dropped first


class ClassroomCache:
    """One prefix cache per (policy, block size) for the whole class, when the host turns it on.

    Sessions then reuse each other's prompt K/V. At most `max_caches` pools are kept: asking for
    another drops the least recently used one (runs still using it keep it until they close).
    Each cache's pool has its own lock, held only for bookkeeping (see engine.kv_cache), so one
    student's long prefill does not hold up another's step.

    Blocks come back when a student is gone: a runner that is garbage-collected (Streamlit drops a
    session's state when its browser session ends) leaves its decode session in `orphaned`, closed at
    the class's next check-in rather than inside the collector, which may run in the middle of a pool's
    bookkeeping. And a runner checks in on each use: one not seen for `lease_seconds` (a tab left open,
    a session Streamlit has not ended yet) has its session closed; when the student returns, the runner
    rebuilds it from its settings.
    """

    def __init__(self, model: engine.Model, tokens: int, lease_seconds: float = Limits.lease_seconds,
                 max_caches: int = CLASSROOM_CACHES, clock: Callable[[], float] = time.monotonic):
        self.model = model
        self.tokens = tokens
        self.lease_seconds = lease_seconds
        self.max_caches = max_caches
        self.clock = clock  # seconds; injectable for tests
        self._lock = threading.Lock()  # guards the two dicts below, nothing else
        self._caches: OrderedDict[tuple[str, int], engine.PrefixCache] = OrderedDict()  # oldest use first
        self._seen: weakref.WeakKeyDictionary[Runner, float] = weakref.WeakKeyDictionary()
        self.orphaned: deque[engine.DecodeSession] = deque()  # appended by finalizers: no lock needed

    def get(self, policy: str, block_size: int) -> engine.PrefixCache:
        with self._lock:
            key = (policy, block_size)
            cache = self._caches.pop(key, None)
            if cache is None:
                cache = engine.PrefixCache(self.model, policy=policy, block_size=block_size,
                                           capacity_blocks=-(-self.tokens // block_size))
            self._caches[key] = cache
            while len(self._caches) > self.max_caches:
                self._caches.popitem(last=False)
            return cache

    @property
    def kept(self) -> list[tuple[str, int]]:
        """The (policy, block size) of the caches kept, least recently used first."""
        with self._lock:
            return list(self._caches)

    def check_in(self, runner: Runner) -> None:
        """Renew `runner`'s lease, then close the sessions of runners that are gone or whose lease ran out."""
        self.reclaim()
        now = self.clock()
        with self._lock:
            self._seen[runner] = now
            stale = [(other, seen) for other, seen in self._seen.items() if now - seen > self.lease_seconds]
        for other, seen in stale:
            self._expire(other, seen)

    def reclaim(self, collect: bool = False) -> int:
        """Close the sessions of runners that were garbage-collected: their blocks go back to the pool.

        collect: first run the cycle collector, for ended browser sessions held only in reference cycles
        (a cost worth paying only when the pool is full). Returns how many sessions were closed.
        """
        if collect:
            gc.collect()
        closed = 0
        while self.orphaned:
            self.orphaned.popleft().close()
            closed += 1
        return closed

    def _expire(self, runner: Runner, seen: float) -> None:
        if not runner.lock.acquire(blocking=False):
            return  # busy right now, so not gone
        try:
            with self._lock:
                if self._seen.get(runner) != seen:
                    return  # it checked in meanwhile
                del self._seen[runner]
            runner.suspend()
        finally:
            runner.lock.release()


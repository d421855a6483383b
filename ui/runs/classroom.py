"""The class's shared prefix cache, when the host turns it on (KVSCOPE_SHARED_PREFIX_CACHE): one pool per
(policy, block size) that every student's run uses, with its blocks brought back from students who left.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import engine
from ui.host.limits import Limits
from ui.runs.run import Lease, Run, RunBuilder, RunConfig, Seeds

CLASSROOM_CACHES = 3  # (policy, block size) pools a class keeps; the least recently used is dropped first


class ClassroomCache:
    """One prefix cache per (policy, block size) for the whole class, when the host turns it on.

    Sessions then reuse each other's prompt K/V. At most `max_caches` pools are kept: asking for
    another drops the least recently used one (runs still using it keep it until they close).
    Each cache's pool has its own lock, held only for bookkeeping (see engine.kv_cache), so one
    student's long prefill does not hold up another's step.

    The class owns its students' leases (`ClassroomLease`), and blocks come back when a student is gone: a
    lease that is garbage-collected (Streamlit drops a session's state when its browser session ends) leaves its
    generation in `orphaned`, closed at the class's next check-in rather than inside the collector, which
    may run in the middle of a pool's bookkeeping. And a lease checks in on each use: one not seen for
    `lease_seconds` (a tab left open, a session Streamlit has not ended yet) has its run closed; when the student
    returns, the lease rebuilds it from its settings.
    """

    def __init__(
        self,
        model: engine.Model,
        tokens: int,
        lease_seconds: float = Limits.lease_seconds,
        max_caches: int = CLASSROOM_CACHES,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.model = model
        self.tokens = tokens
        self.lease_seconds = lease_seconds
        self.max_caches = max_caches
        self.clock = clock  # seconds; injectable for tests
        self._lock = threading.Lock()  # guards the two dicts below, nothing else
        self._caches: OrderedDict[tuple[str, int], engine.PrefixCache] = OrderedDict()  # oldest use first
        self._seen: weakref.WeakKeyDictionary[ClassroomLease, float] = weakref.WeakKeyDictionary()
        self.orphaned: deque[engine.Generation] = deque()  # appended by finalizers: no lock needed

    def get(self, policy: str, block_size: int) -> engine.PrefixCache:
        with self._lock:
            key = (policy, block_size)
            cache = self._caches.pop(key, None)
            if cache is None:
                cache = engine.PrefixCache(
                    self.model, policy=policy, block_size=block_size, capacity_blocks=-(-self.tokens // block_size)
                )
            self._caches[key] = cache
            while len(self._caches) > self.max_caches:
                self._caches.popitem(last=False)
            return cache

    @property
    def kept(self) -> list[tuple[str, int]]:
        """The (policy, block size) of the caches kept, least recently used first."""
        with self._lock:
            return list(self._caches)

    def lease(self, config: RunConfig, seeds: Seeds, build: RunBuilder) -> ClassroomLease:
        """A lease on a new run of `config` on the class's cache (`seeds` are not needed: the class's cache already
        holds what every page published)."""
        return ClassroomLease(self, lambda: build(cache=self.get(config.policy, config.block_size)))

    def check_in(self, lease: ClassroomLease) -> None:
        """Renew `lease`, then close the runs of leases that are gone or ran out."""
        self.reclaim()
        now = self.clock()
        with self._lock:
            self._seen[lease] = now
            stale = [(other, seen) for other, seen in self._seen.items() if now - seen > self.lease_seconds]
        for other, seen in stale:
            self._expire(other, seen)

    def reclaim(self, collect: bool = False) -> int:
        """Close the sessions of leases that were garbage-collected: their blocks go back to the pool.

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

    def forget(self, lease: ClassroomLease) -> None:
        """`lease` was released: it has nothing left to expire."""
        with self._lock:
            self._seen.pop(lease, None)

    def _expire(self, lease: ClassroomLease, seen: float) -> None:
        if not lease.lock.acquire(blocking=False):
            return  # held right now, so not gone
        try:
            with self._lock:
                if self._seen.get(lease) != seen:
                    return  # it checked in meanwhile
                del self._seen[lease]
            lease.suspend()
        finally:
            lease.lock.release()


class ClassroomLease(Lease):
    """A student's hold on a run on the class's cache. Its blocks are the class's: they come back when the lease
    runs out (`suspend`: the run is closed, and rebuilt from its settings, with the same tokens, at the next use),
    is released, or is garbage-collected with the page that held it."""

    def __init__(self, classroom: ClassroomCache, build: Callable[[], Run]):
        self.lock = threading.RLock()  # held while the student steps: the class never closes a run in use
        self._classroom = classroom
        self._build = build
        self._finalizer: weakref.finalize | None = None
        with self.lock:
            classroom.check_in(self)
            super().__init__(self._open())

    def _open(self) -> Run:
        run = self._build()
        # a shared pool must get the blocks back of a page that is gone
        self._finalizer = weakref.finalize(self, self._classroom.orphaned.append, run.generation)
        self._finalizer.atexit = False
        return run

    def renew(self) -> None:
        with self.lock:
            self._classroom.check_in(self)
            if self.run.closed:  # the lease ran out while the student was away
                self.run = self._open()

    @contextmanager
    def held(self) -> Iterator[Run]:
        with self.lock:
            self.renew()
            yield self.run

    def make_room(self) -> bool:
        return self._classroom.reclaim(collect=True) > 0

    def suspend(self) -> None:
        """Close the run (its blocks go back), keeping what rebuilds it: the next use does."""
        with self.lock:
            self._forget_finalizer()
            self.run.close()

    def release(self) -> None:
        """Close the run (its prompt is published to the class's cache, its blocks go back)."""
        self._classroom.forget(self)
        self.suspend()

    def _forget_finalizer(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None

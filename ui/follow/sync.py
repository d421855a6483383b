"""Rooms off the page's thread: one background thread per process does every store call for the pages.

A page never waits for the store. A leader's draw hands its state to `publish` (a dict write: the latest state
of each page wins, an older one not yet sent is dropped), and reads back whether it still leads. A follower's
poll reads the room as the thread last read it (`watch`): the thread reads every watched room every
`READ_SECONDS`, one read per room for all the pages of the process that follow it.

A store that fails (down, paused, unreachable) is noticed once: the thread keeps what it could not send, says
what went wrong (`error`) and tries again after `RETRY_FIRST`, doubling up to `RETRY_MAX`, so a returning store
gets the leaders' latest states and the followers' reads within a fraction of a second. The store's own calls
have a short timeout (`ui.follow.store.RedisStore`); the thread alone waits for it.

A class's answers (`ui.follow.class_answers`) go the same way: a page hands its browser's answer to `answer`, which
the thread sends as one field of the round's map (a second answer of the browser replaces its first). The thread keeps
every answer it was given for `ANSWER_KEEP` and sends them all again when a failing store works again: a store that
restarted empty gets them back, and none counts twice. A teacher's page reads its round's answers as the thread last
read them (`tally`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ui.follow.rooms import Room, Rooms
from ui.follow.store import StoreError

READ_SECONDS = 0.25  # a watched room is read this often (a follower polls the result twice a second)
RETRY_FIRST, RETRY_MAX = 0.1, 0.25  # seconds before trying a failing store again: doubles up to RETRY_MAX
WATCH_KEEP = 60.0  # a room no page asked about for this long is no longer read
PAGE_KEEP = 60.0  # a leading page not heard from for this long is forgotten
ANSWER_KEEP = 4 * 3600.0  # a lesson: the answers kept to send again after a store's outage
log = logging.getLogger("kvscope")


@dataclass(frozen=True)
class Seen:
    """A room as last read: `room` None when it does not exist or could not be read (`error` says why)."""

    room: Room | None
    error: str | None = None


def shown(seen: Seen) -> tuple | None:
    """What a follower shows of a room: its version and state (None: no room)."""
    return None if seen.room is None else (seen.room.version, seen.room.query)


@dataclass(frozen=True)
class Job:
    secret: str
    query: dict[str, str] | None  # None: end the room
    claim: bool = False


class RoomSync:
    """Publishes, ends and reads rooms (`rooms`) on a thread of its own; every method returns at once, but for
    `watch(wait=…)` and `settle`, which wait at most the time they are given.

    The thread's schedule (reads, retries, what it forgets) runs on `clock` (seconds), and it idles with
    `idle(condition, seconds)` (None: until notified): injectable for tests, which move a clock by hand and see
    when the thread idles. The callers' own waits (`watch`, `settle`) are real time."""

    def __init__(
        self,
        rooms: Rooms,
        on_change: Callable[[str], object] | None = None,
        clock: Callable[[], float] = time.monotonic,
        idle: Callable[[threading.Condition, float | None], object] = threading.Condition.wait,
    ):
        self.rooms = rooms
        self.on_change = on_change  # called on the thread with a watched room's code when its state changed
        self._clock, self._idle = clock, idle
        self._lock = threading.Condition()
        self._jobs: dict[str, Job] = {}  # page id → its latest job not sent yet
        self._superseded: set[str] = set()  # pages another page took the room from
        self._heard: dict[str, float] = {}  # page id → when it last published
        self._watched: dict[str, float] = {}  # room code → when a page last asked for it
        self._seen: dict[str, Seen] = {}
        self._given_up: set[str] = set()  # rooms a page stopped waiting for before their first read
        self._answers: dict[tuple[str, str], tuple[str, float]] = {}  # (map key, field) → (answer, when given)
        self._unsent: set[tuple[str, str]] = set()
        self._tallies: dict[str, float] = {}  # map key → when a page last asked for it
        self._read_tallies: dict[str, dict[str, str]] = {}
        self._error: str | None = None
        self._retry_at, self._retry_wait = 0.0, RETRY_FIRST
        self._next_read = 0.0
        self._hurry = False  # a round is wanted now (a new room to read, a caller settling)
        self._started = self._finished = 0  # rounds
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="kvscope-rooms", daemon=True)
        self._thread.start()

    # -- the pages' side ---------------------------------------------------------------------------------

    def publish(self, page: str, secret: str, query: dict[str, str], claim: bool = False) -> None:
        """Send page `page`'s state to its room; `claim` takes the room from any other page. A page that lost
        the room sends nothing until it claims it again."""
        with self._lock:
            if claim:
                self._superseded.discard(page)
            elif page in self._superseded:
                return
            pending = self._jobs.get(page)
            keep_claim = pending is not None and pending.query is not None and pending.claim
            self._jobs[page] = Job(secret, dict(query), claim or keep_claim)
            self._heard[page] = self._clock()
            self._lock.notify_all()

    def end(self, page: str, secret: str) -> None:
        """Delete the room (its followers then wait for it to come back)."""
        with self._lock:
            self._jobs[page] = Job(secret, None)
            self._superseded.discard(page)
            self._lock.notify_all()

    def leads(self, page: str) -> bool:
        """False once another page has claimed the room this page published to."""
        with self._lock:
            return page not in self._superseded

    def answer(self, key: str, field: str, value: str) -> None:
        """Set `field` of the map at `key` to `value` (a browser's answer in a round's map), now and again after
        any outage of the store."""
        with self._lock:
            self._answers[(key, field)] = (value, self._clock())
            self._unsent.add((key, field))
            self._lock.notify_all()

    def sent(self, key: str, field: str) -> bool:
        """Whether the store took the answer last given for (`key`, `field`)."""
        with self._lock:
            return (key, field) in self._answers and (key, field) not in self._unsent

    def tally(self, key: str) -> dict[str, str] | None:
        """The map at `key` as last read, and read from now on (None: not read yet)."""
        with self._lock:
            if key not in self._tallies:
                self._hurry = True
                self._lock.notify_all()
            self._tallies[key] = self._clock()
            return self._read_tallies.get(key)

    @property
    def error(self) -> str | None:
        """Why the store could not be used at the last try; None when it worked."""
        with self._lock:
            return self._error

    def watch(self, code: str, wait: float = 0.0) -> Seen | None:
        """The room `code` as last read, and read from now on; a room not read yet is waited for up to `wait`
        seconds (not at all while the store is failing, whose error it then says), else None: not known yet, and
        its first read is told (`on_change`) as a change is."""
        deadline = time.monotonic() + wait
        with self._lock:
            self._watched[code] = self._clock()
            if code not in self._seen:
                self._hurry = True
                self._lock.notify_all()
                while code not in self._seen and self._error is None and time.monotonic() < deadline:
                    self._lock.wait(deadline - time.monotonic())
            if code not in self._seen and self._error is not None:
                return Seen(None, self._error)
            if code not in self._seen:
                self._given_up.add(code)  # its first read is told (`on_change`): the page waits for it
            return self._seen.get(code)

    def settle(self, timeout: float = 10.0) -> bool:
        """Wait until a whole round started after this call has finished (every job sent, every watched room
        read) or failed; False if that took more than `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self._lock:
            wanted = self._started + 1
            self._hurry = True
            self._lock.notify_all()
            while self._finished < wanted and time.monotonic() < deadline:
                self._lock.wait(deadline - time.monotonic())
            return self._finished >= wanted

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._thread.join(timeout=5)

    # -- the thread ----------------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._closed and (wait := self._idle_for()) != 0.0:
                    self._idle(self._lock, wait)
                if self._closed:
                    return
                jobs, codes, answers, tallies = self._start_round()
            error = self._round(jobs, codes, answers, tallies)
            with self._lock:
                self._end_round(jobs, codes, error)

    def _idle_for(self) -> float | None:
        """Seconds until the next round is due (0: now; None: when something is asked)."""
        now = self._clock()
        if self._error is not None and now < self._retry_at:
            return self._retry_at - now
        reading = self._watched or self._tallies
        if self._jobs or self._unsent or self._hurry or (reading and now >= self._next_read):
            return 0.0
        return self._next_read - now if reading else None

    def _start_round(self) -> tuple[dict[str, Job], list[str], dict[tuple[str, str], str], list[str]]:
        now = self._clock()
        self._started += 1
        self._hurry = False
        self._next_read = now + READ_SECONDS
        for code in [c for c, asked in self._watched.items() if now - asked > WATCH_KEEP]:
            del self._watched[code]
            self._seen.pop(code, None)
        for page in [p for p, heard in self._heard.items() if now - heard > PAGE_KEEP]:
            del self._heard[page]
            self._superseded.discard(page)
        for key in [k for k, asked in self._tallies.items() if now - asked > WATCH_KEEP]:
            del self._tallies[key]
            self._read_tallies.pop(key, None)
        for given in [g for g, (_, at) in self._answers.items() if now - at > ANSWER_KEEP]:
            del self._answers[given]
            self._unsent.discard(given)
        jobs, self._jobs = self._jobs, {}
        answers = {given: self._answers[given][0] for given in self._unsent}
        return jobs, list(self._watched), answers, list(self._tallies)

    def _round(
        self, jobs: dict[str, Job], codes: list[str], answers: dict[tuple[str, str], str], tallies: list[str]
    ) -> StoreError | None:
        """Send the jobs (each removed from `jobs` once done) and the answers, then read the rooms and the tallies;
        the store's error, if any."""
        try:
            for page in list(jobs):
                job = jobs[page]
                if job.query is None:
                    self.rooms.end(job.secret)
                elif self.rooms.publish(job.secret, job.query, page, job.claim) is None:
                    with self._lock:
                        self._superseded.add(page)
                del jobs[page]
            for (key, field), value in answers.items():
                self.rooms.store.put_field(key, field, value, ANSWER_KEEP)
                with self._lock:
                    if self._answers.get((key, field), ("",))[0] == value:  # not replaced while it was sent
                        self._unsent.discard((key, field))
            seen = {code: Seen(self.rooms.read(code)) for code in codes}
            read = {key: self.rooms.store.fields(key) for key in tallies}
        except StoreError as error:
            return error
        with self._lock:
            changed = [
                code
                for code, now in seen.items()
                if code in self._given_up or code in self._seen and shown(self._seen[code]) != shown(now)
            ]
            self._given_up.difference_update(seen)
            self._seen.update(seen)
            self._read_tallies.update(read)
        for code in changed if self.on_change else ():
            try:
                self.on_change(code)
            except Exception:  # noqa: BLE001 — telling pages early is a courtesy; the thread must go on
                log.warning("telling pages of a room's change failed", exc_info=True)
        return None

    def _end_round(self, unsent: dict[str, Job], codes: list[str], error: StoreError | None) -> None:
        """Under the lock: keep what was not sent (unless its page sent something newer), note the store's state."""
        for page, job in unsent.items():
            newer = self._jobs.get(page)
            if newer is None:
                self._jobs[page] = job
            elif job.claim and newer.query is not None:
                self._jobs[page] = Job(newer.secret, newer.query, True)
        if error is None:
            if self._error is not None:
                log.warning("the room store works again")
                self._unsent.update(self._answers)  # a store that restarted empty gets every answer back
            self._error, self._retry_wait = None, RETRY_FIRST
        else:
            if self._error is None:
                log.warning("the room store failed: %s", error)  # once per outage, not once per try
            self._error = str(error)
            self._retry_at = self._clock() + self._retry_wait
            self._retry_wait = min(2 * self._retry_wait, RETRY_MAX)
            for code in codes:
                self._seen[code] = Seen(None, self._error)
        self._finished = self._started
        self._lock.notify_all()

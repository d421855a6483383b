"""Pages draw by turns: the teacher's page first, then its followers one at a time, then students on their own.

One server's pages share one interpreter and two cores. A class of thirty drawing side by side left the
teacher's press waiting behind everyone's work (seconds, with a few students on the heaviest links), and the
event loop, which sends every page's messages, too little of the interpreter to send anything early. So:

- the **leader** (the teacher's page) never waits for a turn, and while it draws nobody else starts;
- **followers** draw the teacher's step one at a time, each sent while the next is drawn (`FOLLOWERS`);
- **explorers** (a page on its own: a student exploring, anyone without a room) start only while no leader or
  follower draws or waits, `EXPLORERS` at a time, and one more press whose work is short (`SHORT_SECONDS`, the
  short lane) while the others hold theirs, unless a class is led (a third thread on two cores slowed the
  teacher's press); a page that must wait is told so (`waiting`).

Pages waiting for a turn of one role go by the work their press has done so far, least first, and in the order they
came among equals: a fresh press has done none. Long work never holds a turn through its whole length: between its
steps, and between two layers of a pass (a link's catch-up of a hundred steps, a prefill of seven hundred tokens in
64 KV splits, the eviction lab's steps), a page that has held its turn for `SHARE_SECONDS` gives way to the pages
waiting ahead of it (with less work done), and to the leader while it draws (`share`), then queues again by the work
it has done: an ordinary press whose step outlasts `SHARE_SECONDS` comes back before a catch-up of many seconds, and
the long work still goes on between presses. One layer of long work cannot be cut (a layer of Gemma's 686-token
prefill in 64 KV splits takes 2 s on one core of the AVX2 VM), so a short press does not wait for one: it takes the
short lane beside two pages' long work. A student's wait is then the short work ahead of them. No page waits for
ever all the same: a follower past `TURN_WAIT`, an explorer past `EXPLORER_WAIT`, draws anyway. A turn is given up
while its page only waits (the paint gap before its figures, `aside`; another page's step of a shared run,
`TurnLock`), except the leader's: the teacher's figures come next, and a student's heavy step started meanwhile would
hold them up; a page back from waiting goes first.

Lock order: a page's own run lock, then a turn, then a shared run's `TurnLock` or a memo's build lock. A page
never waits for a turn while it holds one, and never for a `TurnLock` while it holds a turn: a page sharing its
turn in the middle of a shared run's pass (holding the run's lock) gets it back from any page that wants that run.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ui.host import press_log

LEADER, FOLLOWER, EXPLORER = "leader", "follower", "explorer"
FOLLOWERS = 1  # followers drawing at once (2 and 3 were measured too: a later first follower, the last no sooner)
EXPLORERS = 2  # explorers drawing at once, when the class is quiet: one per core
TURN_WAIT = 3.0  # seconds a follower waits at most (it never holds up a class for good)
EXPLORER_WAIT = 10.0  # seconds an explorer waits at most: a class that keeps drawing never starves a student
SHARE_SECONDS = 0.1  # a turn held this long gives way, between two steps or layers, to the pages waiting ahead
SHORT_SECONDS = 1.0  # a press that has held its turn less than this is short: it may take the short lane
LED_SECONDS = 10.0  # a leader that drew this recently leads a class: the short lane stays closed
clock = time.monotonic  # when a turn was taken (tests set their own)

_changed = threading.Condition()  # guards the counts and queues below
_drawing = {LEADER: 0, FOLLOWER: 0, EXPLORER: 0}  # runs drawing now, by role
# the runs waiting, by role: each ticket's place in line, (0 back from `aside` or 1, seconds of work done, ticket)
_lines: dict[str, dict[int, tuple[int, float, int]]] = {FOLLOWER: {}, EXPLORER: {}}
_tickets = itertools.count()
_lane = 0  # explorers drawing in the short lane, beyond EXPLORERS (0 or 1)
_led_at = -math.inf  # when a leader last started or stopped drawing
_held = threading.local()  # the role this thread holds a turn for, if any, and since when


def _free(role: str, ticket: int) -> str | None:
    """How the run of `role` holding `ticket` may start now (under `_changed`), when nobody of its role waits ahead of
    it: "turn" where its role has room, "lane" for a short press beside explorers' turns (None: not now)."""
    line = _lines.get(role)
    if line and min(line.values())[2] != ticket:
        return None
    if role == FOLLOWER:
        return "turn" if _drawing[FOLLOWER] < FOLLOWERS else None
    if role == EXPLORER:
        if _drawing[LEADER] or _drawing[FOLLOWER] or _waiting(FOLLOWER):
            return None
        if _drawing[EXPLORER] < EXPLORERS:
            return "turn"
        short = line[ticket][1] < SHORT_SECONDS
        return "lane" if short and not _lane and clock() - _led_at >= LED_SECONDS else None
    return "turn"


def _waiting(role: str) -> bool:
    """Whether a run of `role` waits for a turn (under `_changed`)."""
    return bool(_lines[role])


def _take(
    role: str,
    waiting: Callable[[bool], None] | None,
    done: float = 0.0,
    ahead: bool = False,
    handing_over: bool = False,
) -> None:
    """Wait for a turn of `role` behind the runs of its role that have done less work than `done` seconds (or as
    much, and came first), or before them all (`ahead`: a page coming back from `aside`, which was drawing), at
    most its wait (then it draws anyway), and count it as drawing. `waiting(class_first)` is told before it waits:
    whether the teacher's class (the leader or a follower) goes first. `handing_over`: the thread's turn (let go of)
    is given back in the same breath as it queues, so nobody behind it takes the turn first."""
    patience = {FOLLOWER: TURN_WAIT, EXPLORER: EXPLORER_WAIT}.get(role, 0.0)
    with _changed:
        if handing_over:
            _release(role)
        ticket = next(_tickets)
        if role in _lines:
            _lines[role][ticket] = (0 if ahead else 1, done, ticket)
        if how := _free(role, ticket):
            _start(role, ticket, how)
            return
        class_first = bool(_drawing[LEADER] or _drawing[FOLLOWER] or _waiting(FOLLOWER))
        _changed.notify_all()  # one more waiting (what `drawing`'s readers and the tests watch)
    started, since = False, press_log.clock()
    try:
        if waiting is not None:
            waiting(class_first)  # outside the lock: it draws on the page
        deadline = time.monotonic() + patience
        with _changed:
            while not (how := _free(role, ticket)) and (left := deadline - time.monotonic()) > 0:
                _changed.wait(left)
            _start(role, ticket, how or "anyway")
            started = True
        press_log.record("turn", since, press_log.clock() - since)
    finally:
        if not started:  # stopped while it waited (a newer run of the page: Streamlit stops a script at a call)
            with _changed:
                _leave(role, ticket)


def _start(role: str, ticket: int, how: str) -> None:
    """Count the run holding `ticket` as drawing (under `_changed`), in the short lane or not (`how`)."""
    global _lane, _led_at
    _leave(role, ticket)
    _drawing[role] += 1
    _led_at = clock() if role == LEADER else _led_at
    _held.lane = how == "lane"
    _lane += _held.lane


def _release(role: str) -> None:
    """This thread's run no longer draws (under `_changed`)."""
    global _lane, _led_at
    _drawing[role] -= 1
    _led_at = clock() if role == LEADER else _led_at
    _lane -= _held.lane
    _held.lane = False
    _changed.notify_all()


def _leave(role: str, ticket: int) -> None:
    """`ticket` leaves the line (under `_changed`): a ticket left behind would hold up every run after it."""
    _lines.get(role, {}).pop(ticket, None)
    _changed.notify_all()  # the next in line, or an explorer waiting for this follower's queue to empty


def _hold(role: str) -> None:
    """This thread holds a turn of `role` from now."""
    _held.role, _held.since, _held.took = role, clock(), press_log.clock()


def _let_go() -> None:
    """This thread's turn ends: its length counts as work done, and is recorded."""
    _held.role = None
    _held.done += clock() - _held.since
    press_log.record("turn held", _held.took, press_log.clock() - _held.took)


def _give_back(role: str) -> None:
    _let_go()
    with _changed:
        _release(role)


@contextmanager
def turn(role: str, waiting: Callable[[bool], None] | None = None) -> Iterator[None]:
    """Hold a turn of `role` (LEADER, FOLLOWER or EXPLORER) for the block; `waiting(class_first)` is called once,
    before the run waits, when it must (to say so on its page: whether the teacher's class goes first). A thread
    that holds a turn already takes no second one."""
    if getattr(_held, "role", None) is not None:
        yield
        return
    _take(role, waiting)
    _held.done = 0.0  # seconds this run has held its turn: its place when it queues again
    _hold(role)
    try:
        yield
    finally:
        _give_back(role)


def share() -> None:
    """Between two steps of long work, or two layers of its pass: once this thread has held its turn for
    `SHARE_SECONDS`, give way to the pages waiting ahead of it (a follower to followers with less work done; an
    explorer to followers, to the leader while it draws, and to explorers with less work done), and queue by the work
    done for the turn back. No-op for the leader, for a thread without a turn, or when nobody waits ahead."""
    role = getattr(_held, "role", None)
    if role in (None, LEADER) or (now := clock()) - _held.since < SHARE_SECONDS:
        return
    place = (1, _held.done + now - _held.since, math.inf)  # where it would queue: after the waiting as far on
    with _changed:
        followers, explorers = _lines[FOLLOWER], _lines[EXPLORER]
        if role == FOLLOWER:
            ahead = bool(followers) and min(followers.values()) < place
        else:
            ahead = bool(followers or _drawing[LEADER] or explorers and min(explorers.values()) < place)
    if not ahead:
        return
    _let_go()
    try:
        _take(role, None, done=_held.done, handing_over=True)
    finally:
        _hold(role)


@contextmanager
def aside() -> Iterator[None]:
    """The block only waits: this thread's turn, if it holds one (not the leader's), goes to the next page
    meanwhile, and is taken back after."""
    role = getattr(_held, "role", None)
    if role in (None, LEADER):
        yield
        return
    _give_back(role)
    try:
        yield
    finally:
        _take(role, None, done=_held.done, ahead=True)  # it was drawing: back before the pages that queued meanwhile
        _hold(role)


class TurnLock:
    """A shared run's lock (reentrant) whose waiters give their turn away while they wait (`aside`), then take it
    back: the page holding the lock may be sharing its turn in the middle of a pass, and gets it back from them."""

    def __init__(self):
        self._lock = threading.RLock()

    def __enter__(self) -> None:
        if self._lock.acquire(blocking=False):
            return
        with press_log.timed("run lock"):
            while not self._lock.acquire(blocking=False):
                with aside():  # the turn comes back ahead of the pages that queued meanwhile
                    with self._lock:  # free now; taken again below with the turn
                        pass

    def __exit__(self, *exc) -> None:
        self._lock.release()


def drawing() -> dict[str, int]:
    """Runs drawing now, by role (for tests and benches)."""
    with _changed:
        return dict(_drawing)

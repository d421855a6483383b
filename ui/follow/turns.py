"""Pages draw by turns: the teacher's page first, then its followers one at a time, then students on their own.

One server's pages share one interpreter and two cores. A class of thirty drawing side by side left the
teacher's press waiting behind everyone's work (seconds, with a few students on the heaviest links), and the
event loop, which sends every page's messages, too little of the interpreter to send anything early. So:

- the **leader** (the teacher's page) never waits for a turn, and while it draws nobody else starts;
- **followers** draw the teacher's step one at a time, each sent while the next is drawn (`FOLLOWERS`);
- **explorers** (a page on its own: a student exploring, anyone without a room) start only while no leader or
  follower draws or waits, `EXPLORERS` at a time; a page that must wait is told so (`waiting`).

No page waits for ever: a follower past `TURN_WAIT`, an explorer past `EXPLORER_WAIT`, draws anyway. A turn is
given up while its page only waits (the paint gap before its figures, `aside`), except the leader's: the
teacher's figures come next, and a student's heavy step started meanwhile would hold them up.

Lock order: a page's own run lock, then a turn, then a shared run's or a memo's build lock. A page never waits
for a turn while it holds one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

LEADER, FOLLOWER, EXPLORER = "leader", "follower", "explorer"
FOLLOWERS = 1  # followers drawing at once (2 and 3 were measured too: a later first follower, the last no sooner)
EXPLORERS = 2  # explorers drawing at once, when the class is quiet: one per core
TURN_WAIT = 3.0  # seconds a follower waits at most (it never holds up a class for good)
EXPLORER_WAIT = 10.0  # seconds an explorer waits at most: a class that keeps drawing never starves a student

_changed = threading.Condition()  # guards the two counts below
_drawing = {LEADER: 0, FOLLOWER: 0, EXPLORER: 0}  # runs drawing now, by role
_queued = {FOLLOWER: 0, EXPLORER: 0}  # runs waiting for a turn, by role
_held = threading.local()  # the role this thread holds a turn for, if any


def _free(role: str) -> bool:
    """Whether a run of `role` may start now (under `_changed`)."""
    if role == FOLLOWER:
        return _drawing[FOLLOWER] < FOLLOWERS
    if role == EXPLORER:
        return not (_drawing[LEADER] or _drawing[FOLLOWER] or _queued[FOLLOWER]) and _drawing[EXPLORER] < EXPLORERS
    return True


def _take(role: str, waiting: Callable[[], None] | None) -> None:
    """Wait for a turn of `role` (at most its wait; then it draws anyway), and count it as drawing."""
    patience = {FOLLOWER: TURN_WAIT, EXPLORER: EXPLORER_WAIT}.get(role, 0.0)
    with _changed:
        if _free(role):
            _drawing[role] += 1
            return
        _queued[role] += 1
    if waiting is not None:
        waiting()  # outside the lock: it draws on the page
    deadline = time.monotonic() + patience
    with _changed:
        while not _free(role) and (left := deadline - time.monotonic()) > 0:
            _changed.wait(left)
        _queued[role] -= 1
        _drawing[role] += 1
        _changed.notify_all()  # an explorer may have waited for this follower's queue to empty


def _give_back(role: str) -> None:
    with _changed:
        _drawing[role] -= 1
        _changed.notify_all()


@contextmanager
def turn(role: str, waiting: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold a turn of `role` (LEADER, FOLLOWER or EXPLORER) for the block; `waiting` is called once, before the
    run waits, when it must (to say so on its page). A thread that holds a turn already takes no second one."""
    if getattr(_held, "role", None) is not None:
        yield
        return
    _take(role, waiting)
    _held.role = role
    try:
        yield
    finally:
        _held.role = None
        _give_back(role)


@contextmanager
def aside() -> Iterator[None]:
    """The block only waits: this thread's turn, if it holds one (not the leader's), goes to the next page
    meanwhile, and is taken back after."""
    role = getattr(_held, "role", None)
    if role in (None, LEADER):
        yield
        return
    _held.role = None
    _give_back(role)
    try:
        yield
    finally:
        _take(role, None)
        _held.role = role


def drawing() -> dict[str, int]:
    """Runs drawing now, by role (for tests and benches)."""
    with _changed:
        return dict(_drawing)

"""Followers draw the teacher's step one at a time.

A teacher's move starts a run of every follower's step on this server at once (`ui.follow.push`). Thirty runs
side by side share the interpreter with the server's event loop, which sends every run's messages: it got so
little of it that no follower was sent anything before all thirty were nearly done, in one burst at the end
(bench/browser_latency.py's sockets part). Taking turns, each follower's step is drawn and sent while the next is
drawn: the first followers see it much sooner, the last no later. A turn is given up while its page only waits
(the paint gap before its figures, `aside`), and a turn not had within `TURN_WAIT` is not waited for any longer.

Lock order: a page's own run lock, then a turn, then a shared run's or a memo's build lock. Pages that do not
follow never take a turn, so a turn's holder never waits for a page that waits for a turn.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

TURNS = 1  # followers drawing at once (2 and 3 were measured too: a later first follower, the last no sooner)
TURN_WAIT = 3.0  # seconds: a run that waited this long draws anyway (it never holds up a class for good)
_turns = threading.Semaphore(TURNS)
_held = threading.local()  # whether this thread holds a turn now


@contextmanager
def turn(wanted: bool = True) -> Iterator[None]:
    """Hold a turn for the block (`wanted` False: no turn, as for a page that does not follow)."""
    if not wanted or getattr(_held, "turn", False):  # a turn is not taken twice by one run
        yield
        return
    _held.turn = _turns.acquire(timeout=TURN_WAIT)
    try:
        yield
    finally:
        if _held.turn:
            _turns.release()
        _held.turn = False


@contextmanager
def aside() -> Iterator[None]:
    """The block only waits: this thread's turn, if it holds one, goes to the next page meanwhile."""
    if not getattr(_held, "turn", False):
        yield
        return
    _turns.release()
    _held.turn = False
    try:
        yield
    finally:
        _held.turn = _turns.acquire(timeout=TURN_WAIT)

"""Followers' runs take turns (`ui.follow.turns`): one draws at a time, a waiting one gives its turn away, a turn
not had in time is not waited for, and a page that does not follow never waits. Threads stand for runs; each
records when its block began and ended."""

import threading
import time

import pytest

from ui.follow import turns

HOLD = 0.2  # seconds a run holds its block


def run_in_thread(body) -> threading.Thread:
    thread = threading.Thread(target=body)
    thread.start()
    return thread


def drawing(events: list, name: str, wanted: bool = True, hold: float = HOLD):
    def body():
        with turns.turn(wanted):
            events.append((name, "begin"))
            time.sleep(hold)
            events.append((name, "end"))
    return body


def test_one_follower_draws_at_a_time():
    events = []
    threads = [run_in_thread(drawing(events, name)) for name in "abc"]
    for thread in threads:
        thread.join()
    assert [kind for _, kind in events] == ["begin", "end"] * 3, events


def test_a_page_that_does_not_follow_never_waits_for_a_turn():
    events = []
    follower = run_in_thread(drawing(events, "follower"))
    time.sleep(0.05)
    run_in_thread(drawing(events, "teacher", wanted=False, hold=0)).join()
    follower.join()
    assert events.index(("teacher", "end")) < events.index(("follower", "end")), events


def test_a_run_that_only_waits_gives_its_turn_to_the_next_and_takes_one_back_after():
    events = []

    def waiting():
        with turns.turn():
            events.append(("waiter", "begin"))
            with turns.aside():
                events.append(("waiter", "aside"))
                time.sleep(2 * HOLD)
            events.append(("waiter", "back"))
            time.sleep(HOLD)
            events.append(("waiter", "end"))

    waiter = run_in_thread(waiting)
    time.sleep(0.05)
    other = run_in_thread(drawing(events, "other", hold=3 * HOLD))  # holds its turn past the waiter's wait
    waiter.join()
    other.join()
    assert events.index(("other", "begin")) < events.index(("waiter", "back")), events  # drew while it waited
    assert events.index(("other", "end")) < events.index(("waiter", "back")), events  # then waited for its turn


def test_a_turn_not_had_in_time_is_not_waited_for_and_is_not_given_back_twice(monkeypatch):
    monkeypatch.setattr(turns, "TURN_WAIT", 0.1)
    events = []
    stuck = run_in_thread(drawing(events, "stuck", hold=5 * HOLD))
    time.sleep(0.05)
    started = time.perf_counter()
    run_in_thread(drawing(events, "late", hold=0)).join()
    assert time.perf_counter() - started < 3 * HOLD, events  # it drew without its turn
    stuck.join()
    monkeypatch.undo()  # a turn is waited for as long as ever again
    events.clear()
    threads = [run_in_thread(drawing(events, name)) for name in "ab"]  # still one turn, not two
    for thread in threads:
        thread.join()
    assert [kind for _, kind in events] == ["begin", "end"] * 2, events


@pytest.fixture(autouse=True)
def no_turn_left_held():
    yield
    assert turns._turns.acquire(timeout=1), "a turn was never given back"  # noqa: SLF001
    turns._turns.release()  # noqa: SLF001

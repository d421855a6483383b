"""Pages draw by turns (`ui.runs.turns`): the leader never waits, followers draw one at a time, explorers only
while the class is quiet (and are told when they wait), a page that only waits gives its turn away, and nobody
waits for ever. Threads stand for page runs; each blocks in its turn until the test lets it go."""

import itertools
import threading

import pytest

from ui.runs import turns
from ui.runs.turns import EXPLORER, FOLLOWER, LEADER

WAIT = 5.0  # seconds: a bound for a test that would otherwise hang, never a pace
ORDER = itertools.count()  # what happened first, across the pages' threads


class Page:
    """A page run in a thread: takes a turn of `role`, says it began, holds it until `finish` is set."""

    def __init__(self, role: str, aside: bool = False):
        self.role, self.aside = role, aside
        self.began, self.finish, self.told, self.back = (threading.Event() for _ in range(4))
        self.class_first = None  # what the page was told when it waited: whether the teacher's class went first
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        with turns.turn(self.role, self._waits):
            self.began_at = next(ORDER)
            self.began.set()
            if self.aside:
                with turns.aside():
                    self.finish.wait(WAIT)
                self.back_at = next(ORDER)
                self.back.set()
            self.finish.wait(WAIT)

    def _waits(self, class_first: bool):
        self.class_first = class_first
        self.told.set()

    def done(self):
        self.finish.set()
        self.thread.join(WAIT)
        assert not self.thread.is_alive()


def queued(role: str, count: int = 1) -> None:
    """Wait until `count` runs of `role` wait for a turn (the test's threads got there)."""
    with turns._changed:  # noqa: SLF001
        assert turns._changed.wait_for(
            lambda: len(turns._lines[role]) >= count,  # noqa: SLF001
            WAIT,
        )


def test_followers_draw_one_at_a_time():
    first = Page(FOLLOWER)
    assert first.began.wait(WAIT)
    second = Page(FOLLOWER)
    queued(FOLLOWER)
    assert not second.began.is_set() and second.told.is_set()
    first.done()
    assert second.began.wait(WAIT)
    second.done()


def test_the_leader_never_waits_and_explorers_wait_while_it_draws():
    follower = Page(FOLLOWER)
    assert follower.began.wait(WAIT)
    leader = Page(LEADER)
    assert leader.began.wait(WAIT) and not leader.told.is_set()  # beside a drawing follower, at once
    explorer = Page(EXPLORER)
    queued(EXPLORER)
    assert explorer.told.is_set() and explorer.class_first and not explorer.began.is_set()
    follower.done()
    assert not explorer.began.wait(0.2)  # the leader still draws
    leader.done()
    assert explorer.began.wait(WAIT)
    explorer.done()


def test_an_explorer_waits_for_followers_waiting_their_turn_then_explorers_draw_side_by_side():
    drawing_follower = Page(FOLLOWER)
    assert drawing_follower.began.wait(WAIT)
    waiting_follower = Page(FOLLOWER)
    queued(FOLLOWER)
    explorer = Page(EXPLORER)
    queued(EXPLORER)
    drawing_follower.done()
    assert waiting_follower.began.wait(WAIT) and not explorer.began.is_set()
    waiting_follower.done()
    assert explorer.began.wait(WAIT)
    others = [Page(EXPLORER) for _ in range(turns.EXPLORERS)]
    assert others[0].began.wait(WAIT)  # EXPLORERS at once
    queued(EXPLORER)
    assert sum(page.began.is_set() for page in others) == turns.EXPLORERS - 1
    assert [page.class_first for page in others if page.told.is_set()] == [False]  # classmates go first, no teacher
    explorer.done()
    assert all(page.began.wait(WAIT) for page in others)
    for page in others:
        page.done()


def test_nobody_waits_past_its_patience(monkeypatch):
    monkeypatch.setattr(turns, "EXPLORER_WAIT", 0.05)
    monkeypatch.setattr(turns, "TURN_WAIT", 0.05)
    leader = Page(LEADER)
    assert leader.began.wait(WAIT)
    explorer, follower = Page(EXPLORER), Page(FOLLOWER)
    assert explorer.began.wait(WAIT) and explorer.told.is_set()  # drew anyway, told first
    blocked = Page(FOLLOWER)
    assert follower.began.wait(WAIT) and blocked.began.wait(WAIT)  # the second follower drew anyway too
    for page in (leader, explorer, follower, blocked):
        page.done()


def test_a_follower_that_only_waits_gives_its_turn_away_and_the_leaders_aside_keeps_its_own():
    """A page that only waits (its paint gap) gives its turn away; it was drawing, so it takes it back before a page
    that came meanwhile. The leader's paint gap keeps its turn."""
    waiter = Page(FOLLOWER, aside=True)
    assert waiter.began.wait(WAIT)
    other = Page(FOLLOWER)
    assert other.began.wait(WAIT)  # drew while the waiter waited
    later = Page(FOLLOWER)
    queued(FOLLOWER)
    waiter.finish.set()
    assert not waiter.back.wait(0.2)  # then waits for its turn back
    queued(FOLLOWER, 2)  # ahead of `later`
    other.done()
    assert waiter.back.wait(WAIT) and later.began.wait(WAIT)
    assert waiter.back_at < later.began_at
    waiter.done()
    later.done()
    leader = Page(LEADER, aside=True)
    assert leader.began.wait(WAIT)
    explorer = Page(EXPLORER)
    queued(EXPLORER)  # the leader's paint gap is not a gap for a student's heavy step
    leader.done()
    assert explorer.began.wait(WAIT)
    explorer.done()


class LongWork:
    """An explorer's catch-up in a thread: it takes a turn, then does `steps` steps, each waiting for the test's
    go, calling `turns.share` between two steps."""

    def __init__(self, steps: int, role: str = EXPLORER):
        self.go = [threading.Event() for _ in range(steps)]
        self.started = [threading.Event() for _ in range(steps)]
        self.finished = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(role,), daemon=True)
        self.thread.start()

    def _run(self, role):
        with turns.turn(role):
            for started, go in zip(self.started, self.go):
                started.set()
                assert go.wait(WAIT)
                turns.share()
        self.finished.set()


@pytest.fixture
def now(monkeypatch):
    """The turns' clock, moved by the test."""
    clock = [0.0]
    monkeypatch.setattr(turns, "clock", lambda: clock[0])
    return clock


def test_long_work_gives_way_between_steps_to_a_press_that_waits(monkeypatch, now):
    monkeypatch.setattr(turns, "EXPLORERS", 1)
    heavy = LongWork(3)
    assert heavy.started[0].wait(WAIT)
    press = Page(EXPLORER)
    queued(EXPLORER)
    heavy.go[0].set()  # a step within SHARE_SECONDS of the turn: it goes on, the press still waits
    assert heavy.started[1].wait(WAIT) and not press.began.is_set()
    now[0] += turns.SHARE_SECONDS
    heavy.go[1].set()  # the next step ends past it: the press goes next, before the heavy page's third step
    assert press.began.wait(WAIT)
    queued(EXPLORER)  # the heavy page waits behind it
    assert not heavy.started[2].is_set()
    press.done()
    assert heavy.started[2].wait(WAIT)  # then goes on
    heavy.go[2].set()
    assert heavy.finished.wait(WAIT)


def test_long_work_resumes_behind_the_presses_that_came_while_it_waited(monkeypatch, now):
    """Two catch-ups take turns; a press that comes while one waits to resume goes before it, though it came later."""
    monkeypatch.setattr(turns, "EXPLORERS", 1)
    first = LongWork(2)
    assert first.started[0].wait(WAIT)
    second = LongWork(2)
    queued(EXPLORER)
    now[0] += turns.SHARE_SECONDS
    first.go[0].set()  # gives way to the second, and waits to resume
    assert second.started[0].wait(WAIT)
    press = Page(EXPLORER)
    queued(EXPLORER)
    now[0] += turns.SHARE_SECONDS
    second.go[0].set()  # gives way: to the press, which came after the first catch-up queued again
    assert press.began.wait(WAIT)
    assert not first.started[1].is_set() and not second.started[1].is_set()
    press.done()
    assert first.started[1].wait(WAIT)  # then the catch-ups, in the order they queued
    first.go[1].set()
    assert second.started[1].wait(WAIT)
    second.go[1].set()
    assert first.finished.wait(WAIT) and second.finished.wait(WAIT)


def test_a_press_that_shares_its_turn_comes_back_before_long_work_that_has_done_more(monkeypatch, now):
    """A press whose one step outlasts SHARE_SECONDS gives way in the middle; it queues again by the work it has
    done, so it goes before a catch-up that has held its turn longer, though the catch-up queued first."""
    monkeypatch.setattr(turns, "EXPLORERS", 1)
    heavy = LongWork(3)
    assert heavy.started[0].wait(WAIT)
    press = LongWork(2)
    queued(EXPLORER)
    now[0] += 10 * turns.SHARE_SECONDS
    heavy.go[0].set()  # after a second of catch-up: gives way to the press
    assert press.started[0].wait(WAIT)
    queued(EXPLORER)  # the catch-up waits to resume, with a second done
    now[0] += turns.SHARE_SECONDS
    press.go[0].set()  # the press's step passed SHARE_SECONDS: it gives way to the catch-up, which queued first...
    assert press.started[1].wait(WAIT)  # ...but has done more: the press comes back first
    assert not heavy.started[1].is_set()
    press.go[1].set()
    assert press.finished.wait(WAIT)
    assert heavy.started[1].wait(WAIT)
    heavy.go[1].set()
    assert heavy.started[2].wait(WAIT)
    heavy.go[2].set()
    assert heavy.finished.wait(WAIT)


def test_a_short_press_draws_beside_long_work_in_the_short_lane_one_at_a_time(monkeypatch, now):
    """A layer of long work cannot be cut: a press that has done little takes the short lane beside it at once,
    one press at a time."""
    monkeypatch.setattr(turns, "EXPLORERS", 1)
    monkeypatch.setattr(turns, "SHORT_SECONDS", 1.0)
    heavy = LongWork(1)
    assert heavy.started[0].wait(WAIT)
    press = Page(EXPLORER)
    assert press.began.wait(WAIT) and not press.told.is_set()  # beside the heavy page's layer, without a wait
    second = Page(EXPLORER)
    queued(EXPLORER)  # the lane holds one press
    assert not second.began.is_set()
    press.done()
    assert second.began.wait(WAIT)
    second.done()
    heavy.go[0].set()
    assert heavy.finished.wait(WAIT)


def test_the_short_lane_stays_closed_while_a_class_is_led(monkeypatch, now):
    """A third thread on two cores slows the teacher's press: while a leader drew within LED_SECONDS, a short press
    waits for a turn as it did before the lane."""
    monkeypatch.setattr(turns, "EXPLORERS", 1)
    monkeypatch.setattr(turns, "SHORT_SECONDS", 1.0)
    leader = Page(LEADER)
    assert leader.began.wait(WAIT)
    leader.done()
    heavy = LongWork(1)
    assert heavy.started[0].wait(WAIT)
    press = Page(EXPLORER)
    queued(EXPLORER)
    now[0] += turns.LED_SECONDS - 0.5  # the class is still led
    heavy.go[0].set()
    assert press.began.wait(WAIT)  # its turn came when the heavy page's layer ended
    press.done()
    assert heavy.finished.wait(WAIT)
    heavy = LongWork(1)
    assert heavy.started[0].wait(WAIT)
    now[0] += 1.0  # the teacher has not drawn for LED_SECONDS: the lane opens
    press = Page(EXPLORER)
    assert press.began.wait(WAIT)
    press.done()
    heavy.go[0].set()
    assert heavy.finished.wait(WAIT)


def test_long_work_past_short_seconds_waits_for_a_turn_not_the_lane(monkeypatch, now):
    monkeypatch.setattr(turns, "EXPLORERS", 1)
    monkeypatch.setattr(turns, "SHORT_SECONDS", 1.0)
    first = LongWork(2)
    assert first.started[0].wait(WAIT)
    second = LongWork(2)  # nothing done yet: short, in the lane
    assert second.started[0].wait(WAIT)
    press = Page(EXPLORER)
    queued(EXPLORER)  # the turn and the lane are held
    now[0] += 2.0
    second.go[0].set()  # two seconds done: gives way to the press, which has done less, and takes the lane
    assert press.began.wait(WAIT)
    press.done()
    assert not second.started[1].wait(0.2)  # the lane is free, but the second page's work is long now
    first.go[0].set()  # gives way to it (as much done, and queued first)
    assert second.started[1].wait(WAIT)
    second.go[1].set()
    assert second.finished.wait(WAIT)
    assert first.started[1].wait(WAIT)
    first.go[1].set()
    assert first.finished.wait(WAIT)


def test_a_page_waiting_for_a_shared_runs_lock_gives_its_turn_to_the_page_stepping_it(monkeypatch, now):
    """A page sharing its turn in the middle of a shared run's pass holds the run's lock; a page that takes the turn
    and then asks for that run waits aside, and the first page's pass goes on at once (not after a patience)."""
    monkeypatch.setattr(turns, "EXPLORERS", 1)
    monkeypatch.setattr(turns, "EXPLORER_WAIT", 60.0)
    lock = turns.TurnLock()
    stepping, reader_has_lock = LongWork(2), threading.Event()

    def read():
        with turns.turn(EXPLORER), lock:
            reader_has_lock.set()

    with lock:  # the run's lock, as the stepping page's pass holds it (in the test's thread: RLock-free of it)
        assert stepping.started[0].wait(WAIT)
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        queued(EXPLORER)
        now[0] += turns.SHARE_SECONDS
        stepping.go[0].set()  # shares: the reader takes the turn, finds the lock held, and gives the turn back
        assert stepping.started[1].wait(WAIT)
        assert not reader_has_lock.is_set()
    stepping.go[1].set()
    assert stepping.finished.wait(WAIT)
    reader.join(WAIT)
    assert reader_has_lock.is_set()


def test_long_work_goes_on_when_nobody_waits_and_gives_way_to_the_leader(now):
    heavy = LongWork(3)
    assert heavy.started[0].wait(WAIT)
    now[0] += 10 * turns.SHARE_SECONDS
    heavy.go[0].set()  # nobody waits: no pause
    assert heavy.started[1].wait(WAIT)
    leader = Page(LEADER)
    assert leader.began.wait(WAIT)
    heavy.go[1].set()  # the teacher draws: the student's work waits for it
    queued(EXPLORER)
    assert not heavy.started[2].is_set()
    leader.done()
    assert heavy.started[2].wait(WAIT)
    heavy.go[2].set()
    assert heavy.finished.wait(WAIT)


def test_pages_waiting_for_a_turn_go_in_the_order_they_came(monkeypatch):
    monkeypatch.setattr(turns, "EXPLORERS", 1)
    first = Page(EXPLORER)
    assert first.began.wait(WAIT)
    waiting = []
    for count in range(1, 4):
        waiting.append(Page(EXPLORER))
        queued(EXPLORER, count)
    first.done()
    for i, page in enumerate(waiting):
        assert page.began.wait(WAIT)
        assert not any(later.began.is_set() for later in waiting[i + 1 :])
        page.done()


def test_a_run_stopped_while_it_waits_leaves_the_line(monkeypatch):
    """Streamlit stops a page's run at its next call, which may be the notice that it waits: its place in line goes
    with it, and the page after it does not wait for a turn nobody will take (here: its whole patience)."""
    monkeypatch.setattr(turns, "EXPLORERS", 1)
    monkeypatch.setattr(turns, "EXPLORER_WAIT", 60.0)
    holder = Page(EXPLORER)
    assert holder.began.wait(WAIT)

    def stopped(class_first):
        raise RuntimeError("a newer run of this page")

    failed = []
    thread = threading.Thread(target=lambda: failed.append(pytest.raises(RuntimeError, turns._take, EXPLORER, stopped)))
    thread.start()
    thread.join(WAIT)
    assert failed and not turns._lines[EXPLORER]  # noqa: SLF001
    after = Page(EXPLORER)
    queued(EXPLORER)
    holder.done()
    assert after.began.wait(WAIT)
    after.done()


def test_a_thread_takes_no_second_turn():
    with turns.turn(FOLLOWER):
        with turns.turn(EXPLORER):
            assert turns.drawing() == {LEADER: 0, FOLLOWER: 1, EXPLORER: 0}


@pytest.fixture(autouse=True)
def lane_closed(monkeypatch):
    """The turns and the lines, tested with the short lane closed (no press is short); the lane's own tests open
    it."""
    monkeypatch.setattr(turns, "SHORT_SECONDS", 0.0)
    monkeypatch.setattr(turns, "_led_at", -float("inf"))  # no class led before the test


@pytest.fixture(autouse=True)
def no_turn_left_held():
    yield
    assert turns.drawing() == {LEADER: 0, FOLLOWER: 0, EXPLORER: 0}
    assert {role: len(line) for role, line in turns._lines.items()} == {FOLLOWER: 0, EXPLORER: 0}  # noqa: SLF001

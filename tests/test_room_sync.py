"""The rooms' background thread (ui/follow/sync.py) and one leader per room (ui/follow/rooms.py), on a real redis-server
that the tests pause (SIGSTOP), stop and start again on the same port, and on the in-process store. Nothing here is
timed: a test waits for what the thread does (a round, a call to the store, a room told) or moves its clock by hand."""

import os
import signal
import threading

import pytest

from tests.helpers import WAIT_MS
from tests.redis_server import redis_process
from tests.server import free_port
from ui.follow import rooms
from ui.follow.rooms import Rooms
from ui.follow.store import MemoryStore, RedisStore, StoreError
from ui.follow.sync import RETRY_FIRST, RETRY_MAX, RoomSync, Seen

STATE = {"step": "3", "prompt": "Why is the sky blue?"}
WAIT_S = WAIT_MS / 1000  # a harness timeout: only keeps a hung test from hanging


class Told:
    """A RoomSync's `on_change`: the codes it was told, in order; a test waits for the next."""

    def __init__(self):
        self.codes: list[str] = []
        self._changed = threading.Condition()

    def __call__(self, code: str) -> None:
        with self._changed:
            self.codes.append(code)
            self._changed.notify_all()

    def wait_for(self, count: int) -> list[str]:
        """The codes told once there are `count`."""
        with self._changed:
            assert self._changed.wait_for(lambda: len(self.codes) >= count, WAIT_S), f"told only {self.codes}"
            return list(self.codes)


class Held:
    """A real store whose calls, from `hold` until `release`, wait before they start: the rooms' thread is then
    inside a store call (as on a hung store) for as long as the test wants, and says so (`inside`)."""

    def __init__(self, store):
        self.store = store
        self.inside = threading.Event()  # a held call has begun
        self._go = threading.Event()
        self._go.set()

    def hold(self) -> None:
        self.inside.clear()
        self._go.clear()

    def release(self) -> None:
        self._go.set()

    def __getattr__(self, name):
        operation = getattr(self.store, name)

        def held(*args, **options):
            if not self._go.is_set():
                self.inside.set()
                self._go.wait()
            return operation(*args, **options)

        return held


def settles(room_sync: RoomSync) -> bool:
    return room_sync.settle(timeout=WAIT_S)


@pytest.fixture
def own_redis(tmp_path):
    """A redis-server of this test's own: (url, process)."""
    with redis_process(tmp_path) as (url, process):
        yield url, process


@pytest.fixture
def synced(own_redis):
    """A RoomSync on the test's Redis, through a `Held` store, telling a `Told`: (sync, store, told)."""
    store, told = Held(RedisStore(own_redis[0])), Told()
    room_sync = RoomSync(Rooms(store), on_change=told)
    yield room_sync, store, told
    store.release()
    room_sync.close()


def stored_query(url: str, code: str) -> dict | None:
    """The room as Redis holds it, read with a client of the test's own (None: absent or Redis not answering)."""
    try:
        room = Rooms(RedisStore(url)).read(code)
    except StoreError:
        return None
    return room.query if room else None


def test_a_paused_redis_never_holds_up_a_publish_and_the_latest_state_lands_when_it_resumes(own_redis, synced):
    url, process = own_redis
    sync_on, store, told = synced
    secret, code = rooms.lead_or_resume("1")
    sync_on.publish("laptop", secret, STATE, claim=True)
    assert settles(sync_on) and stored_query(url, code) == STATE
    os.kill(process.pid, signal.SIGSTOP)
    try:
        sync_on.publish("laptop", secret, {**STATE, "step": "4"})
        assert settles(sync_on) and sync_on.error is not None  # the thread's try timed out, and says so
        store.hold()
        sync_on.publish("laptop", secret, {**STATE, "step": "5"})
        assert store.inside.wait(WAIT_S)  # the thread is in a store call, and stays there until released
        answers = []

        def page():  # a leader's draws and a follower's first look, while the thread is stuck in the store
            for step in range(6, 24):
                sync_on.publish("laptop", secret, {**STATE, "step": str(step)})
            answers.append(sync_on.watch(code, wait=2 * WAIT_S))  # were it to wait for a read: past the join

        pages = threading.Thread(target=page)
        pages.start()
        pages.join(WAIT_S)
        assert not pages.is_alive() and answers, "a publish or a watch waited for the store"
        assert answers == [Seen(None, sync_on.error)]  # a failing store is not waited for: its error is the answer
        store.release()
        assert settles(sync_on)  # a whole round since: the room read, and failed
        seen = sync_on.watch(code)
        assert seen.room is None and seen.error
        assert told.codes == []
    finally:
        os.kill(process.pid, signal.SIGCONT)
    assert told.wait_for(1) == [code]  # told once the store is back: the room read again, the state sent
    assert stored_query(url, code) == {**STATE, "step": "23"}  # the latest state sent (none in between)
    assert sync_on.watch(code).room.query == {**STATE, "step": "23"} and sync_on.error is None


def test_a_stopped_redis_started_again_empty_gets_the_leaders_state_back(tmp_path, own_redis, synced):
    url, process = own_redis
    sync_on, _, told = synced
    secret, code = rooms.lead_or_resume("1")
    sync_on.publish("laptop", secret, STATE, claim=True)
    assert sync_on.watch(code, wait=WAIT_S).room.query == STATE
    process.terminate()
    process.wait()
    sync_on.publish("laptop", secret, {**STATE, "step": "4"})  # the teacher moves while Redis is down
    assert settles(sync_on) and sync_on.error is not None
    assert sync_on.watch(code) == Seen(None, sync_on.error)
    assert told.codes == []
    with redis_process(tmp_path, port=int(url.rsplit(":", 1)[1].split("/")[0])):  # empty: nothing saved
        assert told.wait_for(1) == [code]  # told once it is read again, with the state sent again
        assert stored_query(url, code) == {**STATE, "step": "4"}
        room = sync_on.watch(code).room
        assert room.query == {**STATE, "step": "4"} and sync_on.error is None


class Counting:
    """A real store whose calls are counted (how often the thread tries a failing store)."""

    def __init__(self, store):
        self.store, self.calls = store, 0

    def __getattr__(self, name):
        operation = getattr(self.store, name)

        def counted(*args, **options):
            self.calls += 1
            return operation(*args, **options)

        return counted


class HandClock:
    """The rooms' thread's clock, moved by hand, and its idling: the thread idles until it is asked something or the
    clock moves (never by itself), and the test waits until it idles again: it has then looked at what it was asked,
    done what was due, and says for how long it means to idle (`idle`)."""

    def __init__(self, now: float = 1000.0):
        self.now = now
        self.idles = 0  # how often the thread began to idle
        self.idle: float | None = None  # for how long, the last time (None: until asked)
        self._state = threading.Condition()
        self._thread_lock: threading.Condition | None = None

    def __call__(self) -> float:
        return self.now

    def wait(self, condition: threading.Condition, seconds: float | None) -> None:
        """RoomSync's `idle`, called holding `condition`."""
        with self._state:
            self._thread_lock = condition
            self.idles += 1
            self.idle = seconds
            self._state.notify_all()
        condition.wait()  # releases it: a publish, a new watch, a close or `move` notifies it

    def idled(self, after: int) -> None:
        """Wait until the thread has begun to idle more than `after` times."""
        with self._state:
            assert self._state.wait_for(lambda: self.idles > after, WAIT_S), "the rooms' thread never idled"

    def ask(self, *asks) -> None:
        """Call `asks` (the last wakes the thread: a publish) holding the thread's lock, then wait until it idles
        again. It idles only holding that lock, so that idle began after all of them: it has seen them all."""
        with self._thread_lock:
            seen = self.idles
            for ask in asks:
                ask()
        self.idled(seen)

    def move(self, seconds: float) -> None:
        def moved():
            self.now += seconds
            self._thread_lock.notify_all()

        self.ask(moved)


def test_a_failing_store_is_tried_once_a_try_with_a_backoff_that_doubles_up_to_its_most():
    """Counted, on a clock moved by hand: pages publishing and reading as often as they like add no try; a try is one
    call; the thread waits RETRY_FIRST, then twice as long each time up to RETRY_MAX, and not a moment less."""
    store = Counting(RedisStore(f"redis://127.0.0.1:{free_port()}/0"))  # nothing listens there
    clock = HandClock()
    room_sync = RoomSync(Rooms(store), clock=clock, idle=clock.wait)
    try:
        clock.idled(0)  # its first look: nothing asked
        assert clock.idle is None and store.calls == 0
        secret, code = rooms.lead_or_resume("1")
        clock.ask(lambda: room_sync.publish("laptop", secret, STATE))
        assert store.calls == 1 and "Redis" in room_sync.error
        answers = []
        backoff = RETRY_FIRST
        for tries in range(2, 7):
            assert clock.idle == pytest.approx(backoff), tries
            for _ in range(10):  # a follower's and a leader's page, far more often than the thread tries
                clock.ask(
                    lambda: answers.append(room_sync.watch(code)), lambda: room_sync.publish("laptop", secret, STATE)
                )
            assert store.calls == tries - 1 and clock.idle == pytest.approx(backoff), tries
            clock.move(backoff / 2)  # not yet
            assert store.calls == tries - 1 and clock.idle == pytest.approx(backoff / 2), tries
            clock.move(clock.idle + 1e-6)  # the rest (a hair more: a sum of decimal seconds may fall a hair short)
            assert store.calls == tries, tries  # one try, one call
            backoff = min(2 * backoff, RETRY_MAX)
        assert {answer.room for answer in answers} == {None} and all(answer.error for answer in answers)
    finally:
        room_sync.close()


def test_the_newest_page_on_a_leader_link_leads_and_the_other_publishes_nothing(store):
    secret, code = rooms.lead_or_resume("1")
    room = Rooms(store)
    assert room.publish(secret, STATE, "laptop", claim=True).leader == "laptop"
    assert room.publish(secret, {**STATE, "step": "5"}, "projector", claim=True).leader == "projector"
    assert room.publish(secret, {**STATE, "step": "9"}, "laptop") is None  # the laptop no longer leads
    assert room.read(code).query == {**STATE, "step": "5"} and room.read(code).leader == "projector"
    assert room.publish(secret, STATE, "laptop", claim=True).version == 3  # taken back: a new version
    assert room.publish(secret, {**STATE, "step": "6"}, "projector") is None
    assert room.read(code).query == STATE


def test_publishes_from_many_threads_lose_no_version(store):
    """Every publish is one atomic read-and-write: 8 threads × 25 changes give 200 versions, none lost."""
    secret, code = rooms.lead_or_resume("1")
    room = Rooms(store)

    def work(n: int):
        for i in range(25):
            room.publish(secret, {"step": f"{n}-{i}"}, "laptop")

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert room.read(code).version == 200


def test_a_page_that_lost_its_room_is_told_and_sends_nothing_until_it_takes_it_back():
    room_sync = RoomSync(Rooms(MemoryStore()))
    try:
        secret, code = rooms.lead_or_resume("1")
        room_sync.publish("laptop", secret, STATE, claim=True)
        assert settles(room_sync)
        room_sync.publish("projector", secret, {**STATE, "step": "1"}, claim=True)
        assert settles(room_sync)
        room_sync.publish("laptop", secret, {**STATE, "step": "7"})  # the laptop's heartbeat or press
        assert settles(room_sync)
        assert not room_sync.leads("laptop") and room_sync.leads("projector")
        for step in ("8", "9"):
            room_sync.publish("laptop", secret, {**STATE, "step": step})
            assert settles(room_sync)
        assert room_sync.watch(code, wait=WAIT_S).room.query == {**STATE, "step": "1"}
        room_sync.publish("laptop", secret, {**STATE, "step": "9"}, claim=True)  # "Lead from this page"
        assert room_sync.leads("laptop")
        room_sync.publish("projector", secret, {**STATE, "step": "2"})
        assert settles(room_sync)
        assert not room_sync.leads("projector")
        assert room_sync.watch(code).room.query == {**STATE, "step": "9"}
    finally:
        room_sync.close()


def test_a_watched_rooms_new_state_is_told_once_and_an_unchanged_one_never():
    told = Told()
    room_sync = RoomSync(Rooms(MemoryStore()), on_change=told)
    try:
        secret, code = rooms.lead_or_resume("1")
        room_sync.publish("laptop", secret, STATE, claim=True)
        assert settles(room_sync)
        assert room_sync.watch(code, wait=WAIT_S).room.query == STATE  # the first read is the page's own: not told
        for _ in range(3):
            assert settles(room_sync)
        assert told.codes == []
        room_sync.publish("laptop", secret, STATE | {"step": "4"})
        assert told.wait_for(1) == [code]  # the new state told
        for _ in range(3):
            assert settles(room_sync)
        assert told.codes == [code]
        room_sync.end("laptop", secret)
        assert told.wait_for(2) == [code, code]  # the room's end told
    finally:
        room_sync.close()


def test_a_room_read_after_its_page_stopped_waiting_is_told():
    """A follower's first draw waits a while for its room's first read; one read too late for it is told, as a
    change is, or the page would wait for its next poll."""
    told, store = Told(), Held(MemoryStore())
    room_sync = RoomSync(Rooms(store), on_change=told)
    try:
        secret, code = rooms.lead_or_resume("1")
        room_sync.publish("laptop", secret, STATE, claim=True)
        assert settles(room_sync)
        store.hold()  # its first read waits until the page has stopped waiting
        assert room_sync.watch(code, wait=0.05) is None  # not read yet
        assert store.inside.wait(WAIT_S)
        assert told.codes == []
        store.release()
        assert told.wait_for(1) == [code]  # the first read told
        assert room_sync.watch(code).room.query == STATE
        for _ in range(3):
            assert settles(room_sync)
        assert told.codes == [code]  # once
    finally:
        store.release()
        room_sync.close()


def test_a_failing_listener_does_not_stop_the_thread():
    def broken(code):
        raise RuntimeError("boom")

    room_sync = RoomSync(Rooms(MemoryStore()), on_change=broken)
    try:
        secret, code = rooms.lead_or_resume("1")
        room_sync.publish("laptop", secret, STATE, claim=True)
        room_sync.watch(code, wait=WAIT_S)
        room_sync.publish("laptop", secret, STATE | {"step": "4"})
        assert settles(room_sync) and settles(room_sync)
        assert room_sync.watch(code).room.query["step"] == "4"
    finally:
        room_sync.close()

"""The rooms' background thread (ui/follow/sync.py) and one leader per room (ui/follow/rooms.py), on a real redis-server
that the tests pause (SIGSTOP), stop and start again on the same port, and on the in-process store."""

import os
import signal
import threading
import time

import pytest

from tests.redis_server import redis_process
from tests.server import free_port
from ui.follow import rooms
from ui.follow.sync import RETRY_MAX, RoomSync, Seen
from ui.follow.rooms import Rooms
from ui.follow.store import MemoryStore, RedisStore, StoreError

STATE = {"step": "3", "prompt": "Why is the sky blue?"}
BACK_SECONDS = 2.0  # the brief: followers back in step within 2 s of the store's return


def wait_for(condition, seconds: float, what: str):
    """Poll `condition` until it is truthy (its value) or `seconds` passed (fail, naming `what`)."""
    deadline = time.monotonic() + seconds
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s: {what}")
        time.sleep(0.02)
    return value


@pytest.fixture
def own_redis(tmp_path):
    """A redis-server of this test's own: (url, process)."""
    with redis_process(tmp_path) as (url, process):
        yield url, process


@pytest.fixture
def sync_on(own_redis):
    room_sync = RoomSync(Rooms(RedisStore(own_redis[0])))
    yield room_sync
    room_sync.close()


def stored_query(url: str, code: str) -> dict | None:
    """The room as Redis holds it, read with a client of the test's own (None: absent or Redis not answering)."""
    try:
        room = Rooms(RedisStore(url)).read(code)
    except StoreError:
        return None
    return room.query if room else None


def test_a_paused_redis_never_holds_up_a_publish_and_the_latest_state_lands_when_it_resumes(own_redis, sync_on):
    url, process = own_redis
    secret, code = rooms.lead_or_resume("1")
    sync_on.publish("laptop", secret, STATE, claim=True)
    assert sync_on.settle() and stored_query(url, code) == STATE
    os.kill(process.pid, signal.SIGSTOP)
    try:
        started = time.perf_counter()
        for step in range(4, 24):
            sync_on.publish("laptop", secret, {**STATE, "step": str(step)})
        assert time.perf_counter() - started < 0.1  # 20 publishes: dict writes (one Redis call alone is 0.5 s)
        assert sync_on.settle() and sync_on.error is not None  # the thread's try timed out, and says so
        started = time.perf_counter()
        seen = sync_on.watch(code, wait=5)
        assert time.perf_counter() - started < 0.1  # a failing store is not waited for: its error is the answer
        assert seen == Seen(None, sync_on.error)
    finally:
        os.kill(process.pid, signal.SIGCONT)
    back = time.monotonic()
    wait_for(lambda: stored_query(url, code) == {**STATE, "step": "23"}, BACK_SECONDS, "the latest state sent")
    wait_for(lambda: sync_on.error is None and sync_on.watch(code).room, BACK_SECONDS - (time.monotonic() - back),
             "the room read again")


def test_a_stopped_redis_started_again_empty_gets_the_leaders_state_back(tmp_path, own_redis, sync_on):
    url, process = own_redis
    secret, code = rooms.lead_or_resume("1")
    sync_on.publish("laptop", secret, STATE, claim=True)
    sync_on.watch(code, wait=5)
    process.terminate()
    process.wait()
    sync_on.publish("laptop", secret, {**STATE, "step": "4"})  # the teacher moves while Redis is down
    assert sync_on.settle() and sync_on.error is not None
    assert sync_on.watch(code) == Seen(None, sync_on.error)
    with redis_process(tmp_path, port=int(url.rsplit(":", 1)[1].split("/")[0])):  # empty: nothing saved
        back = time.monotonic()
        wait_for(lambda: stored_query(url, code) == {**STATE, "step": "4"}, BACK_SECONDS, "the state sent again")
        room = wait_for(lambda: sync_on.watch(code).room, BACK_SECONDS - (time.monotonic() - back), "read again")
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


def test_a_failing_store_is_noticed_once_and_tried_again_with_backoff():
    store = Counting(RedisStore(f"redis://127.0.0.1:{free_port()}/0"))  # nothing listens there
    room_sync = RoomSync(Rooms(store))
    try:
        secret, code = rooms.lead_or_resume("1")
        started = time.monotonic()
        while time.monotonic() - started < 2.0:  # a leader's and a follower's page, far more often than they do
            room_sync.publish("laptop", secret, STATE)
            room_sync.watch(code)
            time.sleep(0.01)
        # 200 publishes and reads in 2 s: tries after 0.1, 0.2, then every 0.25 s, one call each (~9), not 400
        assert 3 <= store.calls <= 2.0 / RETRY_MAX + 4, store.calls
        assert "Redis" in room_sync.error
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
        assert room_sync.settle()
        room_sync.publish("projector", secret, {**STATE, "step": "1"}, claim=True)
        assert room_sync.settle()
        room_sync.publish("laptop", secret, {**STATE, "step": "7"})  # the laptop's heartbeat or press
        assert room_sync.settle()
        assert not room_sync.leads("laptop") and room_sync.leads("projector")
        for step in ("8", "9"):
            room_sync.publish("laptop", secret, {**STATE, "step": step})
            assert room_sync.settle()
        assert room_sync.watch(code, wait=5).room.query == {**STATE, "step": "1"}
        room_sync.publish("laptop", secret, {**STATE, "step": "9"}, claim=True)  # "Lead from this page"
        assert room_sync.leads("laptop")
        room_sync.publish("projector", secret, {**STATE, "step": "2"})
        assert room_sync.settle()
        assert not room_sync.leads("projector")
        assert room_sync.watch(code).room.query == {**STATE, "step": "9"}
    finally:
        room_sync.close()


def test_a_watched_rooms_new_state_is_told_once_and_an_unchanged_one_never():
    told = []
    room_sync = RoomSync(Rooms(MemoryStore()), on_change=told.append)
    try:
        secret, code = rooms.lead_or_resume("1")
        room_sync.publish("laptop", secret, STATE, claim=True)
        assert room_sync.settle()
        assert room_sync.watch(code, wait=2.0).room.query == STATE  # the first read is the page's own: not told
        for _ in range(3):
            assert room_sync.settle()
        assert told == []
        room_sync.publish("laptop", secret, STATE | {"step": "4"})
        wait_for(lambda: told, 2.0, "the new state told")
        for _ in range(3):
            assert room_sync.settle()
        assert told == [code]
        room_sync.end("laptop", secret)
        wait_for(lambda: len(told) == 2, 2.0, "the room's end told")
    finally:
        room_sync.close()


class Slow:
    """A real store whose reads take `seconds`."""

    def __init__(self, store, seconds: float):
        self.store, self.seconds = store, seconds

    def __getattr__(self, name):
        return getattr(self.store, name)

    def get(self, key):
        time.sleep(self.seconds)
        return self.store.get(key)


def test_a_room_read_after_its_page_stopped_waiting_is_told():
    """A follower's first draw waits a while for its room's first read; one read too late for it is told, as a
    change is, or the page would wait for its next poll."""
    told = []
    room_sync = RoomSync(Rooms(Slow(MemoryStore(), 0.3)), on_change=told.append)
    try:
        secret, code = rooms.lead_or_resume("1")
        room_sync.publish("laptop", secret, STATE, claim=True)
        assert room_sync.settle()
        assert room_sync.watch(code, wait=0.05) is None  # not read yet
        wait_for(lambda: told, 2.0, "the first read told")
        assert room_sync.watch(code).room.query == STATE
        for _ in range(3):
            assert room_sync.settle()
        assert told == [code]  # once
    finally:
        room_sync.close()


def test_a_failing_listener_does_not_stop_the_thread():
    def broken(code):
        raise RuntimeError("boom")

    room_sync = RoomSync(Rooms(MemoryStore()), on_change=broken)
    try:
        secret, code = rooms.lead_or_resume("1")
        room_sync.publish("laptop", secret, STATE, claim=True)
        room_sync.watch(code, wait=2.0)
        room_sync.publish("laptop", secret, STATE | {"step": "4"})
        assert room_sync.settle() and room_sync.settle()
        assert room_sync.watch(code).room.query["step"] == "4"
    finally:
        room_sync.close()

"""Rooms (ui/follow/rooms.py) over both stores (ui/follow/store.py): the in-process MemoryStore and a real
redis-server, as two app servers behind a load balancer share it."""

import threading

import pytest
import redis

from tests.helpers import WAIT_MS, Clock
from ui.follow import rooms
from ui.follow.rooms import Room, Rooms
from ui.follow.store import MemoryStore, RedisStore, StoreError, store_from_env

STATE = {"step": "3", "view": "attention", "prompt": "Why is the sky blue?"}
MOVED = {**STATE, "step": "4"}
WAIT_S = WAIT_MS / 1000  # a harness timeout: only keeps a hung test from hanging


def everything_stored(store) -> list[str]:
    """Every key and value the store holds, read around the Store interface."""
    if isinstance(store, MemoryStore):
        return [text for key, (value, _) in store._items.items() for text in (key, value)]
    client = store._client
    return [text for key in client.keys("*") for text in (key, client.get(key))]


# -- rooms ------------------------------------------------------------------------------------------------


def test_a_published_state_is_read_back_by_its_code_with_a_version_that_grows_only_on_change(store):
    secret, code = rooms.lead_or_resume("1")
    room = Rooms(store)
    assert room.read(code) is None  # nothing is stored before the first publish
    room.publish(secret, STATE)
    assert room.read(code) == Room(code, 1, STATE)
    room.publish(secret, dict(STATE))  # the heartbeat: the same state again
    assert room.read(code).version == 1
    room.publish(secret, MOVED)
    assert room.read(code) == Room(code, 2, MOVED)
    room.publish(secret, STATE)  # back to an earlier state is a change too
    assert room.read(code) == Room(code, 3, STATE)


def test_a_second_server_reads_what_the_first_published(store, redis_url):
    """Two Rooms over two connections: on Redis, two app processes; the follower's reads see every move."""
    other = Rooms(RedisStore(redis_url)) if isinstance(store, RedisStore) else Rooms(store)
    secret, code = rooms.lead_or_resume(None)
    Rooms(store).publish(secret, STATE)
    assert other.read(code) == Room(code, 1, STATE)
    Rooms(store).publish(secret, MOVED)
    assert other.read(code).query == MOVED


def test_a_leaders_link_resumes_its_room_and_lead_1_or_a_malformed_secret_opens_a_new_one(store):
    secret, code = rooms.lead_or_resume("1")
    assert rooms.is_secret(secret) and rooms.is_code(code)
    Rooms(store).publish(secret, STATE)
    assert rooms.lead_or_resume(secret) == (secret, code)  # a reload of the leader's link
    assert Rooms(store).read(rooms.lead_or_resume(secret)[1]).query == STATE
    others = {rooms.lead_or_resume(given) for given in ("1", "1", "", "not-a-secret", secret[:-1], secret + "x")}
    assert len(others) == 6 and all(c != code and s != secret for s, c in others)


def test_codes_and_secrets_are_unguessable_and_independent():
    pairs = [rooms.lead_or_resume("1") for _ in range(200)]
    assert len({s for s, _ in pairs}) == len({c for _, c in pairs}) == 200
    for secret, code in pairs:
        assert len(secret) == 32 and len(code) == rooms.CODE_CHARS == 16  # 192 and 96 random bits
        assert code not in secret and secret not in code


def test_the_secret_is_in_no_key_or_value_of_the_store(store):
    secret, code = rooms.lead_or_resume("1")
    room = Rooms(store)
    room.publish(secret, STATE)
    room.publish(secret, {**MOVED, "lead": "leaked?"})  # even a query that names lead carries no secret
    stored = everything_stored(store)
    assert any(code in text for text in stored)  # the check reads the store: the room is there …
    assert not any(secret in text for text in stored)  # … and the secret is not


def test_unknown_malformed_or_corrupt_codes_are_no_room(store):
    room = Rooms(store)
    assert room.read("A" * rooms.CODE_CHARS) is None
    for bad in ("", "short", "A" * 17, "../../etc/passwd", "A" * 15 + "*", "A" * 4000):
        assert room.read(bad) is None
    secret, code = rooms.lead_or_resume("1")
    for corrupt in ("not json", "[]", '{"version": "x", "query": {}}', '{"query": {}}', '{"version": 1, "query": 3}'):
        store.set(rooms.KEY_PREFIX + code, corrupt, 60)
        assert room.read(code) is None, corrupt


def test_an_ended_room_is_gone(store):
    secret, code = rooms.lead_or_resume("1")
    room = Rooms(store)
    room.publish(secret, STATE)
    room.end(secret)
    assert room.read(code) is None


def test_a_room_not_refreshed_for_its_ttl_expires_in_memory():
    clock = Clock()
    room = Rooms(MemoryStore(clock=clock))
    secret, code = rooms.lead_or_resume("1")
    room.publish(secret, STATE)
    clock.now += rooms.ROOM_TTL_SECONDS - 1
    assert room.read(code) is not None
    room.publish(secret, STATE)  # the heartbeat refreshes the TTL
    clock.now += rooms.ROOM_TTL_SECONDS - 1
    assert room.read(code).query == STATE
    clock.now += 1
    assert room.read(code) is None


def let_time_pass(redis_url: str, seconds: float) -> None:
    """A fake clock for Redis: every key's time to live shortened by `seconds`, as that much time would. A key whose
    time is up is deleted by Redis itself (PEXPIRE with a time ≤ 0 deletes)."""
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter():
        left_ms = client.pttl(key)
        if left_ms >= 0:  # -1: no TTL, -2: gone meanwhile
            client.pexpire(key, left_ms - round(seconds * 1000))


def test_a_room_not_refreshed_for_its_ttl_expires_in_redis(redis_url):
    redis.Redis.from_url(redis_url).flushdb()
    room = Rooms(RedisStore(redis_url))
    ttl, margin = rooms.ROOM_TTL_SECONDS, 10  # margin: real seconds the test's own calls may take
    assert ttl > 2 * margin  # two waits of ttl − margin outlast one TTL: only the refresh keeps the room
    secret, code = rooms.lead_or_resume("1")
    room.publish(secret, STATE)
    let_time_pass(redis_url, ttl - margin)
    assert room.read(code) is not None
    room.publish(secret, STATE)  # refreshed: a TTL from now, not from the first publish
    let_time_pass(redis_url, ttl - margin)
    assert room.read(code).query == STATE
    let_time_pass(redis_url, margin)
    assert room.read(code) is None


def test_redis_keeps_a_key_for_its_ttl_and_then_expires_it_on_its_own_clock(redis_url):
    """The fake clock above shortens TTLs; here the TTL reaches Redis in milliseconds, and Redis's own clock ends
    one: its `expired` event (a keyspace notification) is waited for, not slept through."""
    store, client = RedisStore(redis_url), redis.Redis.from_url(redis_url)
    store.set("kept", "1", 60)
    assert 59_000 < client.pttl("kept") <= 60_000
    client.config_set("notify-keyspace-events", "Ex")
    events = client.pubsub()
    try:
        events.psubscribe("__keyevent@*__:expired")
        assert events.get_message(timeout=WAIT_S)["type"] == "psubscribe"  # listening before the key is set
        store.set("short", "lived", 0.05)
        assert client.pttl("short") <= 50  # milliseconds, not a second rounded up (-2: gone already)
        expired = []
        while b"short" not in expired:  # another test's key may expire meanwhile
            message = events.get_message(timeout=WAIT_S)
            assert message is not None, f"no key expired; saw {expired}"
            expired.append(message["data"])
        assert store.get("short") is None and store.get("kept") == "1"
    finally:
        events.close()
        client.config_set("notify-keyspace-events", "")


# -- stores -----------------------------------------------------------------------------------------------


def test_memory_store_expires_deletes_and_forgets_expired_keys():
    clock = Clock()
    store = MemoryStore(clock=clock)
    store.set("a", "1", 10)
    store.set("b", "2", 20)
    clock.now += 10
    assert store.get("a") is None and store.get("b") == "2"
    store.delete("b")
    store.delete("never set")
    assert store.get("b") is None
    store.set("c", "3", 5)
    clock.now += 6
    store.set("d", "4", 5)  # a set drops what has expired, read or not
    assert set(store._items) == {"d"}


def test_memory_store_is_safe_from_many_threads():
    store = MemoryStore()
    errors = []

    def work(n: int):
        try:
            for i in range(300):
                store.set(f"k{n}-{i}", str(i), 60)
                assert store.get(f"k{n}-{i}") == str(i)
                store.delete(f"k{n}-{i - 1}")
        except Exception as error:  # noqa: BLE001 — collected for the assertion below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert sorted(store._items) == sorted(f"k{n}-299" for n in range(8))


def test_store_from_env_chooses_memory_or_redis_and_refuses_anything_else(redis_url):
    assert isinstance(store_from_env({}), MemoryStore)
    assert isinstance(store_from_env({"KVSCOPE_STORE": "  "}), MemoryStore)
    chosen = store_from_env({"KVSCOPE_STORE": redis_url})
    chosen.set("from-env", "yes", 5)
    assert redis.Redis.from_url(redis_url, decode_responses=True).get("from-env") == "yes"
    for bad in ("http://127.0.0.1:6379", "localhost:6379", "redis://:secret@host:notaport/0"):
        with pytest.raises(StoreError) as raised:
            store_from_env({"KVSCOPE_STORE": bad}).get("x")
        assert "secret" not in str(raised.value)  # a URL's password is never echoed onto a page


def test_an_unreachable_redis_is_a_store_error_not_a_crash():
    from tests.server import free_port

    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0", timeout_seconds=0.5)
    for operation in (lambda: store.get("k"), lambda: store.set("k", "v", 5), lambda: store.delete("k")):
        with pytest.raises(StoreError):
            operation()

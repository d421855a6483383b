"""A small key-value store with expiry, shared by every page that follows a teacher (`ui.follow.rooms`).

One store per process: `MemoryStore` by default (one server), `RedisStore` when the host sets KVSCOPE_STORE to a
redis:// URL (several servers behind a load balancer: a student on one server then follows a teacher on
another). Keys and values are strings; a value set with a TTL is gone `ttl_seconds` after it was last set.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import Protocol

STORE_ENV = "KVSCOPE_STORE"


class StoreError(Exception):
    """The store cannot be reached or was configured wrongly (the message says which)."""


class Store(Protocol):
    def get(self, key: str) -> str | None:
        """The value, or None if it was never set, was deleted or has expired."""

    def set(self, key: str, value: str, ttl_seconds: float) -> None:
        """Set `key` to `value`; it expires `ttl_seconds` (> 0) from now."""

    def delete(self, key: str) -> None:
        """Remove `key` (nothing happens if it is absent)."""

    def update(self, key: str, change: Callable[[str | None], str | None], ttl_seconds: float) -> None:
        """Set `key` to `change(its value now)` with no other write to it in between (`change` may be called
        again if one raced it); `change` returns None to leave the key as it is."""

    def put_field(self, key: str, field: str, value: str, ttl_seconds: float) -> None:
        """Set one field of the map at `key` (other fields stay); the map expires `ttl_seconds` from now."""

    def fields(self, key: str) -> dict[str, str]:
        """The map at `key`: {} if it was never set or has expired."""


class MemoryStore:
    """A dict with expiry, safe for Streamlit's many script threads; `clock` (seconds) is injectable for tests."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self._items: dict[str, tuple[str, float]] = {}  # key → (value, expiry time on `clock`)

    def get(self, key: str) -> str | None:
        with self._lock:
            return self._get_locked(key)

    def _get_locked(self, key: str) -> str | None:
        item = self._items.get(key)
        if item is None:
            return None
        if item[1] <= self._clock():
            del self._items[key]
            return None
        return item[0]

    def set(self, key: str, value: str, ttl_seconds: float) -> None:
        with self._lock:
            now = self._clock()
            self._drop_expired(now)  # rooms are few; this keeps a long-running server's dict from growing
            self._items[key] = (value, now + ttl_seconds)

    def delete(self, key: str) -> None:
        with self._lock:
            self._items.pop(key, None)

    def update(self, key: str, change: Callable[[str | None], str | None], ttl_seconds: float) -> None:
        with self._lock:
            new = change(self._get_locked(key))
            if new is not None:
                self._items[key] = (new, self._clock() + ttl_seconds)

    def put_field(self, key: str, field: str, value: str, ttl_seconds: float) -> None:
        def change(raw: str | None) -> str:
            return json.dumps((json.loads(raw) if raw is not None else {}) | {field: value})

        self.update(key, change, ttl_seconds)  # a map is kept as its JSON: one dict for every kind of value

    def fields(self, key: str) -> dict[str, str]:
        raw = self.get(key)
        return {} if raw is None else json.loads(raw)

    def _drop_expired(self, now: float) -> None:
        for key in [k for k, (_, expiry) in self._items.items() if expiry <= now]:
            del self._items[key]


class RedisStore:
    """The same operations on a Redis server (`url`: redis://host:port/db); every failure is a StoreError.

    One try per call, with a short timeout: the caller (`ui.follow.sync`, off the page's thread) decides when to
    try again. (redis-py's own default retries three times with backoff: 6.5 s a call on a paused server.)"""

    def __init__(self, url: str, timeout_seconds: float = 0.5):
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self._errors = (redis.RedisError, OSError)
        try:
            self._client = redis.Redis.from_url(
                url,
                decode_responses=True,
                socket_timeout=timeout_seconds,
                socket_connect_timeout=timeout_seconds,
                retry=Retry(NoBackoff(), 0),
            )
        except ValueError as error:
            raise StoreError(f"{STORE_ENV} is not a Redis URL") from error

    def get(self, key: str) -> str | None:
        return self._call(self._client.get, key)

    def set(self, key: str, value: str, ttl_seconds: float) -> None:
        self._call(self._client.set, key, value, px=milliseconds(ttl_seconds))

    def delete(self, key: str) -> None:
        self._call(self._client.delete, key)

    def update(self, key: str, change: Callable[[str | None], str | None], ttl_seconds: float) -> None:
        def attempt(pipe) -> None:  # WATCH key, read, MULTI, write, EXEC: redis-py runs it again if key changed
            new = change(pipe.get(key))
            if new is not None:
                pipe.multi()
                pipe.set(key, new, px=milliseconds(ttl_seconds))

        self._call(self._client.transaction, attempt, key)

    def put_field(self, key: str, field: str, value: str, ttl_seconds: float) -> None:
        def both(pipe) -> None:
            pipe.hset(key, field, value)
            pipe.pexpire(key, milliseconds(ttl_seconds))

        self._call(self._client.transaction, both)  # MULTI … EXEC: the field is never left without its expiry

    def fields(self, key: str) -> dict[str, str]:
        return self._call(self._client.hgetall, key)

    def _call(self, operation, *args, **options):
        try:
            return operation(*args, **options)
        except self._errors as error:
            raise StoreError(f"the Redis store cannot be used: {type(error).__name__}: {error}") from error


def milliseconds(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def store_from_env(env: Mapping[str, str]) -> Store:
    """MemoryStore unless KVSCOPE_STORE names a Redis server (redis://, rediss:// or unix://)."""
    url = env.get(STORE_ENV, "").strip()
    if not url:
        return MemoryStore()
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise StoreError(f"{STORE_ENV} must be a redis:// URL")  # not echoed: it may hold a password
    return RedisStore(url)

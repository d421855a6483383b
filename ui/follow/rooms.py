"""Rooms: a teacher's page publishes its state; students' pages read it and follow (plain Python, no Streamlit).

The teacher holds a secret (in a cookie of the teacher's browser, `ui.follow.teacher_browser`, or a link the teacher
keeps, `lead=<secret>`); the students' code (`follow=<code>`) is derived from it by a one-way hash, so the code never
reveals the secret, and the teacher's page resumes the same room with the same code even on a server that has just
restarted with an empty store. The
store holds only the code's published state (the link's query dict and a version), never the secret.

A room lives while its leader publishes: each publish sets a TTL, and a room not refreshed for `ttl_seconds`
is gone (followers then wait for it to come back).

One page leads a room at a time: each leading page has an id of its own (`new_page_id`, not the secret), and the
room names the page that leads it. A page claims the room when it opens the leader's link (or takes it back);
a later publish from another page changes nothing and is told it no longer leads, so two tabs on one secret
never both reach the followers. Every publish is one atomic read-and-write of the store (`Store.update`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
from dataclasses import dataclass

from ui.follow.store import Store

ROOM_TTL_SECONDS = 30.0
SECRET_BYTES = 24  # token_urlsafe(24): 32 characters, 192 random bits
CODE_CHARS = 16  # 96 bits of the hash: unguessable, short enough for a link a student may type
_SECRET_SHAPE = re.compile(r"[A-Za-z0-9_-]{32}")
_CODE_SHAPE = re.compile(r"[A-Za-z0-9_-]{%d}" % CODE_CHARS)
KEY_PREFIX = "kvscope:room:"


@dataclass(frozen=True)
class Room:
    """What a room publishes: `query` is a link's parameters (`ui.state.link.to_query`), `version` grows with each
    change of it (followers compare it to the version they applied)."""

    code: str
    version: int
    query: dict[str, str]
    leader: str = ""  # the id of the page that leads the room ("": none named)


def new_secret() -> str:
    return secrets.token_urlsafe(SECRET_BYTES)


def is_secret(text: str) -> bool:
    """Shaped like a secret `new_secret` makes (anything else, such as `lead=1`, opens a new room)."""
    return bool(_SECRET_SHAPE.fullmatch(text))


def is_code(text: str) -> bool:
    return bool(_CODE_SHAPE.fullmatch(text))


def code_for(secret: str) -> str:
    """The students' code for the room `secret` leads: a one-way hash of it."""
    digest = hashlib.sha256(b"kvscope room\0" + secret.encode()).digest()
    return base64.urlsafe_b64encode(digest).decode()[:CODE_CHARS]


def new_page_id() -> str:
    """A leading page's own id: tells two pages on one secret apart (it grants nothing)."""
    return secrets.token_urlsafe(9)


def lead_or_resume(*given: str | None) -> tuple[str, str]:
    """(secret, code) of the room a leader names: the first of `given` shaped like a secret (a reload resumes its
    room, whether or not the store still holds it), else a new secret (`lead=1`). Nothing is stored until the first
    `Rooms.publish`."""
    secret = next((g for g in given if isinstance(g, str) and is_secret(g)), None) or new_secret()
    return secret, code_for(secret)


class Rooms:
    """Open, resume, publish, read and end rooms in `store` (any `ui.follow.store.Store`)."""

    def __init__(self, store: Store, ttl_seconds: float = ROOM_TTL_SECONDS):
        self.store = store
        self.ttl_seconds = ttl_seconds

    def publish(self, secret: str, query: dict[str, str], page: str = "", claim: bool = False) -> Room | None:
        """Publish page `page`'s state and refresh the room's TTL (the heartbeat calls this too): the version grows
        only when `query` differs from what the room holds. With `claim` the page takes the room; without, a room
        that another page leads is left as it is and None says so."""
        code = code_for(secret)
        done: list[Room] = []

        def change(raw: str | None) -> str | None:
            done.clear()  # the store may call this again after a concurrent write
            current = self.parse(code, raw)
            if current is not None and current.leader not in ("", page) and not claim:
                return None
            same = current is not None and current.query == query
            version = (current.version if current else 0) + (0 if same else 1)
            done.append(Room(code, version, dict(query), page))
            return json.dumps({"version": version, "query": query, "leader": page})

        self.store.update(KEY_PREFIX + code, change, self.ttl_seconds)
        return done[0] if done else None

    def read(self, code: str) -> Room | None:
        """The room's published state; None if the code is malformed, unknown or its room has expired."""
        if not is_code(code):
            return None
        return self.parse(code, self.store.get(KEY_PREFIX + code))

    @staticmethod
    def parse(code: str, raw: str | None) -> Room | None:
        if raw is None:
            return None
        try:
            data = json.loads(raw)
            query = {str(k): str(v) for k, v in data["query"].items()}
            return Room(code, int(data["version"]), query, str(data.get("leader", "")))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None  # not a room this code wrote: treated as no room

    def end(self, secret: str) -> None:
        """The leader stops sharing: followers see the class has ended at their next poll."""
        self.store.delete(KEY_PREFIX + code_for(secret))

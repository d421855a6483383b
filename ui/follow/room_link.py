"""The room as a page of either side sees it: the process's `RoomSync` (`ui.follow.sync`) and a page's state as the
link a room holds. The leader's side is `ui.follow.leader`, the follower's `ui.follow.follower`; the page wires them
in (`ui.follow.page`).

A page's part in following is one `FollowState`, under the session key `follow` (`follow_state`).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

import streamlit as st

from ui.follow import push, rooms
from ui.follow.store import StoreError, store_from_env
from ui.follow.sync import RoomSync
from ui.state.link import AppState, to_query
from ui.state.session import kept

OWN = frozenset({"lang", "large"})  # a follower's own settings, never taken from the leader


@dataclass
class FollowState:
    """A browser session's part in following: its role, and each side's state."""

    role: str | None = None  # "lead" | "follow" | "" (neither); None until the page's first draw read its link
    error: str | None = None  # why the store could not be used
    code: str = ""  # the room's code (both sides)
    # The leader's side
    secret: str = ""  # the room's secret, kept in the teacher's browser (`ui.follow.teacher_browser`)
    forget_secret: bool = False  # the page stopped sharing: its browser forgets the secret at the next draw
    page: str = ""  # this page's own id: the newest page on a leader link leads
    claim: bool = False  # the leader's next publish claims the room
    published: dict[str, str] | None = None  # the leader's last published link
    # The follower's side
    mode: str | None = None  # "following" | "alone" | "waiting"
    seen: tuple[int, dict[str, str]] | None = None  # the room's version and state applied
    rejoined_at: float | None = None  # when it followed again by itself (`time.monotonic`)
    pending: dict[str, str] | None = None  # the leader's link, to apply
    shown: dict[str, str] | None = None  # what the follower's page shows, as a room's link
    taken: dict | None = None  # the follower's state as taken from the leader (`followed_part`)
    fresh: bool = False  # the leader's state was just taken: the next check keeps the page's state as `taken`
    class_lang: bool = False  # the follower's link named no language: its first take-over takes the class's
    # The Serving view's class questions (`ui.follow.serving_room`): this page's sender id once it sent one, its last
    # try (`ui.follow.serving_room.clock`), and what happened, shown once
    prompt_sender: str = ""
    prompt_tried_at: float | None = None
    prompt_message: tuple[str, dict] | None = None
    # The class's answers (`ui.follow.ask_round`): this browser's id (its cookie), its answer in the round (round,
    # token id or choice), its last try and what happened, shown once; the teacher's step and chapter the round was
    # opened at, and each revealed round's rows for the export (round → rows, in the order asked)
    browser: str = ""
    answer: tuple[int, int] | None = None
    ask_tried_at: float | None = None
    ask_message: tuple[str, dict] | None = None
    ask_at: tuple[int, int] | None = None
    ask_counting: tuple[int, str] | None = None  # the round whose answers the leader's strip counts, and its phase
    asked: dict[int, list[dict]] = field(default_factory=dict)

    @property
    def tracking(self) -> bool:
        """A follower that follows the room or waits for it (not one exploring on its own)."""
        return self.role == "follow" and self.mode in ("following", "waiting")


def follow_state() -> FollowState:
    """This browser session's `FollowState` (a new one on its first call)."""
    return kept("follow", FollowState)


@st.cache_resource(show_spinner=False, on_release=RoomSync.close)
def room_sync() -> RoomSync:
    """The process's one RoomSync over its one store (KVSCOPE_STORE); a misconfigured store raises StoreError."""
    return RoomSync(rooms.Rooms(store_from_env(os.environ)), on_change=push.notify)


def sync() -> RoomSync | None:
    """The process's RoomSync; None, with the reason in the `FollowState`'s error, when KVSCOPE_STORE is
    misconfigured."""
    try:
        return room_sync()
    except StoreError as error:
        follow_state().error = str(error)
        return None


def the_rooms() -> rooms.Rooms:
    return room_sync().rooms


def room_query(state: AppState) -> dict[str, str]:
    """What a room holds of a page's state: its link's parameters without the page's own language and text size,
    and with the prompt, model and chat switch always named (their defaults depend on the language)."""
    named = {"prompt": state.prompt, "model": state.model, "chat": "1" if state.chat else "0"}
    return {name: value for name, value in to_query(state).items() if name not in OWN} | named


def followed_query(query: dict[str, str]) -> dict[str, str]:
    """What a follower takes of a room's link: all but its own settings (the room also names the class's language,
    which a plain `?follow=<code>` takes on its first take-over)."""
    return {name: value for name, value in query.items() if name not in OWN}


def followed_part(state: AppState) -> dict:
    """What following decides: the state but for the follower's own settings (`OWN`)."""
    return {name: value for name, value in asdict(state).items() if name not in OWN}

"""The room as a page of either side sees it: the process's `RoomSync` (`ui.follow.sync`) and a page's state as the
link a room holds. The leader's side is `ui.follow.leader`, the follower's `ui.follow.follower`; the page wires them
in (`ui.follow.page`).

Session keys: follow_role ("lead" | "follow"), follow_secret and follow_page (leader: the room's secret, this
page's own id), follow_claim (the leader's next publish claims the room), follow_code, follow_mode (follower:
"following" | "alone" | "waiting"), follow_seen (the room's version and state applied), follow_rejoined (following
again by itself), follow_pending (a link to apply), follow_error (why the store could not be used),
follow_published (the leader's last published link), follow_shown (what the follower's page shows, as a room's
link), follow_taken (the follower's state as taken from the leader, `followed_part`), follow_fresh (the leader's
state was just taken: the next check keeps the page's state as follow_taken), follow_class_lang (a follower's link
named no language: its first take-over takes the class's).
"""

from __future__ import annotations

import os
from dataclasses import asdict

import streamlit as st

from ui.follow import push, rooms
from ui.follow.store import StoreError, store_from_env
from ui.follow.sync import RoomSync
from ui.state import AppState, to_query

OWN = frozenset({"lang", "large"})  # a follower's own settings, never taken from the leader
ss = st.session_state


@st.cache_resource(show_spinner=False, on_release=RoomSync.close)
def room_sync() -> RoomSync:
    """The process's one RoomSync over its one store (KVSCOPE_STORE); a misconfigured store raises StoreError."""
    return RoomSync(rooms.Rooms(store_from_env(os.environ)), on_change=push.notify)


def sync() -> RoomSync | None:
    """The process's RoomSync; None, with the reason in follow_error, when KVSCOPE_STORE is misconfigured."""
    try:
        return room_sync()
    except StoreError as error:
        ss.follow_error = str(error)
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

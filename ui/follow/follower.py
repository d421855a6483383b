"""The follower's side of following (`ui.follow.page`). A fragment polls the room and, when the leader's state
changed, stores the leader's link as pending and reruns the page, which applies it before any widget exists
(`ui.follow.page.take_over`). Everything in the link is followed except the follower's own language and text size
(`OWN`).

A follower whose room is gone or cannot be read waits for it (`waiting`): the poll goes on, and the page follows
again by itself, saying so, when the room is published again (the store back, the server restarted, the
teacher's page reloaded). A follower who moves on their own (a step button, Play, any setting but `OWN`) leaves
following, as "Explore on my own" does, and only "Follow the teacher again" brings it back: before the step is
drawn (a run of the whole page or of the step's fragment alone) and once it is drawn, the page's state is
compared with the one it took from the leader (`check`); one that differs reruns the whole page at once, whose
banner then says so.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import streamlit as st

from ui.follow import push
from ui.follow.room_link import follow_state, followed_part, followed_query, room_query, sync
from ui.follow.sync import Seen
from ui.host import streamlit_internals
from ui.host.limits import env_seconds
from ui.state.link import AppState, parse_query
from ui.state.session import page_session

# A follower's page runs as soon as this server's RoomSync reads a new state of its room (`ui.follow.push`); the poll is
# the safety net (a run that was asked for but lost), so it can be slow: a poll is a script run per follower.
POLL_SECONDS = env_seconds(os.environ, "KVSCOPE_FOLLOW_POLL_S", 3.0, 0.1, 3600.0)
JOIN_WAIT = 1.0  # a page waits at most this for a room's first read (opening a follow link, a throttled tab)
# The banner says the page follows again by itself this long: a returning room's first read may be its state from
# before the outage, and the teacher's move made meanwhile comes a moment later; the student must still read it.
REJOINED_SECONDS = 10.0
clock = time.monotonic  # tests move it by hand


def take_step() -> None:
    """At the top of the step's fragment of a following page (a run of the fragment alone, asked for by the
    leader's move, or the fragment within a run of the page): the leader's state as this server last read it. A
    change of the step alone is applied here; any other change is applied by a run of the whole page, before any
    widget exists (`take_over`)."""
    mine = follow_state()
    if not mine.tracking:
        return
    following = mine.mode == "following"
    # A waiting page that follows again changes its banner too: the leader's move then runs the whole page.
    push.listen_step(streamlit_internals.current_fragment_id() if following else None)
    refresh()
    pending = mine.pending
    if pending is None:
        return
    if following and mine.shown is not None and without_step(followed_query(pending)) == without_step(mine.shown):
        page_session().step = parse_query(pending)[0].step
        mine.pending = None
        mine.fresh = True  # the next `check` keeps this step as the leader's
    else:
        st.rerun(scope="app")


def without_step(query: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in query.items() if name != "step"}


def check(state: AppState) -> None:
    """A following (or waiting) page about to draw the step (and again once drawn, for Play's ticks): the first
    check after taking the leader's state keeps `state` as what following looks like (the page may have fitted
    it: a case, the host's limits); a later `state` that differs was moved by its student, who has left following
    (and will not follow again by itself). The page is then drawn again from the top, where the banner says so."""
    mine = follow_state()
    if mine.role != "follow":
        return
    mine.shown = room_query(state)  # a room that says the same is followed without a redraw (`poll`)
    if not mine.tracking:  # waiting: a move of its own is exploring too
        return
    part = followed_part(state)
    fresh, mine.fresh = mine.fresh, False
    if fresh or mine.taken is None:
        mine.taken = part
    elif part != mine.taken:
        leave()
        st.rerun(scope="app")


def join() -> None:
    """Follow the leader from its current state on (a page's first draw, "Follow the teacher again"); if there
    is no room (or no store): say so, and wait for it."""
    mine = follow_state()
    mine.error, mine.mode = None, "waiting"
    room_sync = sync()
    seen = room_sync.watch(mine.code, wait=JOIN_WAIT) if room_sync else Seen(None, mine.error)
    follow_seen(seen or Seen(None), take_any=True)  # not read in time: waiting, and the poll goes on


def follow_seen(seen: Seen, take_any: bool = False) -> None:
    """Follow the room as last read: gone or unreadable, wait for it; a state not applied yet (any state, with
    `take_any`) becomes pending, and a waiting page that takes it says it follows again."""
    mine = follow_state()
    if seen.room is None:
        mine.mode, mine.error = "waiting", seen.error
        push.listen_step(None)  # following again changes the banner: the leader's next move runs the whole page
        return
    applied = (seen.room.version, seen.room.query)  # the version alone restarts at 1 on an emptied store
    if not take_any and mine.mode == "following" and mine.seen == applied:
        return
    if take_any:
        mine.rejoined_at = None
    elif mine.mode == "waiting":
        mine.rejoined_at = clock()
    mine.mode, mine.seen, mine.pending = "following", applied, seen.room.query
    mine.error = None


def banner(t: Callable[..., str]) -> None:
    """The follower's banner, with its poll of the room (a fragment: a change of the banner alone, such as
    following again a room that shows what this page shows, needs no redraw of the page)."""
    poll()
    mine = follow_state()
    with st.container(key="follow-banner"):
        message, button = st.columns([4, 1], vertical_alignment="center")
        if mine.mode == "following":
            rejoined = mine.rejoined_at is not None and clock() - mine.rejoined_at < REJOINED_SECONDS
            message.info(t("follow_rejoined" if rejoined else "follow_following"), icon=":material/school:")
            button.button(t("follow_leave"), key="b_follow_leave", on_click=leave, width="stretch")
        elif mine.mode == "alone":
            message.info(t("follow_alone"), icon=":material/explore:")
            button.button(t("follow_return"), key="b_follow_return", on_click=join, width="stretch")
        elif mine.error:  # waiting: the poll follows again by itself
            message.warning(t("follow_down", error=mine.error))
        else:
            message.warning(t("follow_gone"))


def refresh() -> None:
    """Follow the room as the RoomSync thread last read it (no store call here)."""
    room_sync, mine = sync(), follow_state()
    if room_sync is not None and mine.mode in ("following", "waiting"):  # not after a move of its own
        seen = room_sync.watch(mine.code, wait=JOIN_WAIT)  # waits only for a room not read lately
        if seen is not None:
            follow_seen(seen)


def poll() -> None:
    """A follower's timed check of the room, and of a press of "Follow the teacher again": the page is redrawn when
    the leader's state is not the one it shows."""
    mine = follow_state()
    push.listen(mine.code if mine.mode in ("following", "waiting") else None)
    refresh()
    if mine.pending is None:
        return
    if followed_query(mine.pending) == mine.shown:
        mine.pending = None  # the page shows the leader's state already: only the banner changes
        mine.fresh = True
    else:
        st.rerun(scope="app")  # the leader's state is applied before any widget exists


def leave() -> None:
    """Explore on my own: the page keeps its state; the leader's moves no longer change it."""
    follow_state().mode = "alone"

"""Follow the teacher: the Streamlit side of `ui.follow.rooms`, through the process's `ui.follow.sync.RoomSync`.

A page opened with `lead=1` leads (`ui.follow.leader`; its secret stays in the teacher's browser,
`ui.follow.teacher_browser`); a page opened with `follow=<code>` follows
(`ui.follow.follower`). This module wires them into the page: the role from the link, the leader's state applied
before any widget exists (`take_over`), the panel or banner below the title (`show`), the link's own parameter.
Both sides share the room's view in `ui.follow.room_link`, and the session's `FollowState` there. No page waits for
the store: publishing and reading are the RoomSync thread's.
"""

from __future__ import annotations

from collections.abc import Callable

import streamlit as st

from ui.follow import ask_student, follower, leader, rooms, teacher_browser
from ui.follow.room_link import OWN, follow_state

# Clear of the title's descenders above (the page's one-line title sits tight on what follows it).
SPACING_CSS = "<style>.st-key-follow-banner { margin-top: 0.4rem; }</style>"


def take_over(apply: Callable[[dict[str, str], frozenset[str]], None]) -> None:
    """Called at the top of every page draw, before any widget: the session's role from its link (first draw
    only), then the leader's pending state through `apply(query, own)`: the leader's link parameters, and the
    settings that stay the page's own (`OWN`; the first take-over of a link that named no language takes the
    class's)."""
    mine = follow_state()
    if mine.role is None:
        begin(st.query_params.to_dict())
    if mine.tracking:
        follower.refresh()  # a run pushed by the leader's move (`ui.follow.push`) applies it in this run
    pending, mine.pending = mine.pending, None
    if pending is not None and mine.role == "follow":
        class_lang, mine.class_lang = mine.class_lang, False
        apply(pending, OWN - {"lang"} if class_lang else OWN)
        mine.fresh = True  # the next `check` sees the leader's state as this page fitted it


def begin(params: dict[str, str]) -> None:
    """Lead (`lead=` in the link, a reload resuming its room), follow (`follow=<code>`), or neither. A page that
    opens a leader's link claims its room: the newest page leads (the teacher's projector after their laptop)."""
    mine = follow_state()
    mine.role = ""
    if "lead" in params:
        mine.role = "lead"  # the room of the secret in the link (a teacher's own), else of the browser's, else new
        mine.secret, mine.code = rooms.lead_or_resume(params["lead"], teacher_browser.remembered())
        mine.page, mine.claim = rooms.new_page_id(), True
    elif "follow" in params:
        mine.role = "follow"
        mine.code = params["follow"][:64]
        mine.class_lang = "lang" not in params  # a plain `?follow=<code>` opens in the class's language
        follower.join()


def leading() -> bool:
    """This page leads a room (the teacher's)."""
    return follow_state().role == "lead"


def following() -> bool:
    """This page follows the teacher now (not on its own, not waiting for the room)."""
    mine = follow_state()
    return mine.role == "follow" and mine.mode == "following"


def follows_a_room() -> bool:
    """This page was opened on a follow link (following, waiting or exploring on its own)."""
    return follow_state().role == "follow"


def link_params() -> dict[str, str]:
    """What this session's own link carries besides its state: `lead=1` (the secret stays in the teacher's browser:
    the projector shows this link) or the follower's code."""
    mine = follow_state()
    if mine.role == "lead":
        return {"lead": "1"}
    if mine.role == "follow":
        return {"follow": mine.code}
    return {}


def show(t: Callable[..., str]) -> None:
    """Below the title: the leader's panel, or the follower's banner (`t`: the page's string function)."""
    mine = follow_state()
    role = mine.role
    if mine.forget_secret:
        teacher_browser.forget()
        mine.forget_secret = False
    if role:
        st.html(SPACING_CSS)
    if role == "lead":
        with st.container(key="follow-lead"):  # a strip in the header bar (`leader.STRIP_CSS`)
            leader.panel(t)
            timed(leader.lead_status, leader.LEAD_SECONDS, t)
    elif role == "follow":
        ask_student.keep_browser_id()
        timed(follower.banner, None if mine.mode == "alone" else follower.POLL_SECONDS, t)


def timed(check: Callable[..., None], seconds: float | None, *args) -> None:
    """Run `check(*args)` now and every `seconds` (None: when its own buttons are pressed) as a fragment, inside a
    container of its own: a fragment that draws nothing takes no place in the page, and when its timed run ended
    Streamlit removed the element drawn next (the step counter) as if it were the fragment's."""
    with st.container():
        st.fragment(run_every=seconds)(check)(*args)

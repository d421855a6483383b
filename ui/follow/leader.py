"""The leader's side of following (`ui.follow.page`): the students' link and its QR code, a publish of the page's
state on every draw (`publish`, from the page's link writer) and, every `LEAD_SECONDS`, a refresh of its room and a
word on whether students can follow it (`lead_status`: the store failing, or another page on the same leader link has
taken the room, with a button to take it back). No page waits for the store: publishing is the RoomSync thread's.
"""

from __future__ import annotations

import html
import os
from collections.abc import Callable
from urllib.parse import urlencode, urlsplit, urlunsplit

import segno
import streamlit as st

from ui.follow import ask_round
from ui.follow.room_link import follow_state, room_query, sync
from ui.follow.teacher_browser import remember, students_base
from ui.host.limits import env_seconds
from ui.state.link import AppState
from ui.state.session import settings

# the leader's heartbeat (well inside rooms.ROOM_TTL_SECONDS) and check of its status
LEAD_SECONDS = env_seconds(os.environ, "KVSCOPE_LEAD_S", 1.0, 0.1, 10.0)

# The leader's panel and status (container `follow-lead`) are a collapsed strip in Streamlit's header bar, out of
# the page's flow: the teacher's page keeps the chapter's figure on the projector's first screen, as a student's
# does. Opened, the panel lies over the page. When nothing in flow comes with it in the page's notices (no title, no
# problem after it; an emptied placeholder of a model's first load may come before), they take no place either.
STRIP_CSS = """<style>
[data-testid="stLayoutWrapper"]:has(> .st-key-follow-lead) { position: fixed; top: 0.5rem; right: 1rem;
  z-index: 999991; width: min(22rem, calc(100vw - 5rem)); }
.st-key-follow-lead details, .st-key-follow-lead [data-testid="stAlertContainer"] { background-color: #fff; }
/* a summary short enough to clear a free page's title */
.st-key-follow-lead summary { min-height: 0; padding-top: 0.2rem; padding-bottom: 0.2rem; }
[data-testid="stLayoutWrapper"]:has(> .st-key-follow-lead details[open]) { width: min(60rem, calc(100vw - 2rem));
  max-height: calc(100vh - 1.2rem); overflow-y: auto; box-shadow: 0 0.5rem 2rem rgba(0, 0, 0, 0.25); }
[data-testid="stLayoutWrapper"]:has(> .st-key-notices > :last-child > .st-key-follow-lead)\
:not(:has(> .st-key-notices h1)) {
  position: absolute; }
</style>"""
# The QR code's box: as tall as most of a projected 720-pixel screen allows, on a white quiet zone so that a
# dark theme does not hide it; on a phone, the width of the screen.
QR_CSS = """<style>
.kv-follow-qr img { width: min(62vh, 100%); height: auto; display: block; background: #fff;
  image-rendering: pixelated; }
.kv-follow-link { font-size: 1.1rem; word-break: break-all; }
</style>"""


def publish(state: AppState) -> None:
    """A leader's draw publishes its state as a link's parameters (others: nothing): what followers follow
    (`room_query`), and the class's language, which a student's plain `?follow=<code>` opens in."""
    mine = follow_state()
    if mine.role != "lead":
        return
    mine.published = room_query(state) | {"lang": state.lang}
    send(mine.published)


def send(query: dict[str, str], claim: bool = False) -> None:
    """Hand `query` to the process's RoomSync for the leader's room (it never waits for the store); the page's
    first publish claims the room."""
    room_sync, mine = sync(), follow_state()
    if room_sync is not None:
        claim, mine.claim = mine.claim or claim, False
        room_sync.publish(mine.page, mine.secret, query, claim=claim)


def student_url() -> tuple[str, tuple[str, dict] | None]:
    """The students' link, absolute when the browser told the server its address (else relative), and why phones
    could not open the page's own address, if so (a string key and its fields; `teacher_browser.students_base`)."""
    params = {"follow": follow_state().code}
    lang = settings.get("lang", "en")
    if lang != "en":
        params["lang"] = lang  # students open in the class's language, then choose their own
    address, problem, fields = students_base(st.context.url or "", st.get_option("server.address"))
    base = urlsplit(address)  # scheme, host and path; "" when the browser has not said
    url = urlunsplit((base.scheme, base.netloc, base.path or ("/" if base.netloc else ""), urlencode(params), ""))
    return url, (problem, fields) if problem else None


def panel(t: Callable[..., str]) -> None:
    url, problem = student_url()
    remember(follow_state().secret)
    # A data URI: the page's HTML sanitizer keeps an <img> but strips an inline <svg> element.
    qr = segno.make(url, error="m").svg_data_uri(scale=1, border=3, omitsize=True, light="#fff")
    st.html(STRIP_CSS)
    icon = ":material/qr_code_2:" if problem is None else ":material/wifi_off:"  # seen on the strip, closed
    with st.expander(t("follow_share"), icon=icon, key="follow-share"):
        if problem is not None:
            st.warning(t(problem[0], **problem[1]), icon=":material/wifi_off:")
        qr_column, text_column = st.columns([3, 2])
        qr_column.html(
            f"{QR_CSS}<div class='kv-follow-qr'><img src='{html.escape(qr)}' alt='{html.escape(t('follow_qr'))}'></div>"
        )
        with text_column:
            with st.container(key="follow-link"):
                st.html(
                    f"<div class='kv-follow-link'><a href='{html.escape(url)}' target='_blank'>"
                    f"{html.escape(url)}</a></div>"
                )
            st.markdown(t("follow_share_help"))
            st.button(t("follow_end"), key="b_follow_end", on_click=end_room)


def lead_status(t: Callable[..., str]) -> None:
    """The leader's timed check: its room refreshed (the heartbeat: a page that lost the room sends nothing), how many
    answered the class's round while it is asked, and a warning when students cannot follow: the store fails, or
    another page took the room (with a button to take it back)."""
    room_sync, mine = sync(), follow_state()
    if room_sync is None:
        st.warning(t("follow_lead_down", error=mine.error))
        return
    if mine.published is not None:
        send(mine.published)
    count = ask_round.answered(room_sync, mine.code, mine.ask_counting)
    if count is not None:
        with st.container(key="ask-count"):
            st.markdown(f"**{t(count[0], **count[1])}**")
    if not room_sync.leads(mine.page):
        st.warning(t("follow_superseded"), icon=":material/cast:")
        st.button(t("follow_take_back"), key="b_follow_take_back", on_click=take_back)
    elif room_sync.error:
        st.warning(t("follow_lead_down", error=room_sync.error))


def take_back() -> None:
    """This page leads again: it claims the room (the page that had it is told at its next check)."""
    mine = follow_state()
    if mine.published is not None:
        send(mine.published, claim=True)
    else:
        mine.claim = True


def end_room() -> None:
    """The leader stops sharing: its room is deleted (followers see the class has ended and wait for one) and its
    link drops the secret; the page goes on as a plain page. A page that no longer leads leaves the room be."""
    room_sync, mine = sync(), follow_state()
    if room_sync is not None and room_sync.leads(mine.page):
        room_sync.end(mine.page, mine.secret)
    mine.role = ""  # neither side from now on
    mine.forget_secret = True  # the browser's cookie goes at the next draw (`ui.follow.page.show`)

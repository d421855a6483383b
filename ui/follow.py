"""Follow the teacher: the Streamlit side of `ui.rooms`.

A page opened with `lead=1` leads: it shows the students' link and its QR code, publishes its state on every
draw (`publish`, from the page's link writer) and refreshes its room with a heartbeat. A page opened with
`follow=<code>` follows: a fragment polls the room twice a second and, when the leader's version changed,
stores the leader's link as pending and reruns the page, which applies it before any widget exists
(`take_over`). Everything in the link is followed except the follower's own language and text size (`OWN`).

A follower who moves on their own (a step button, Play, any setting but `OWN`) leaves following, as "Explore on
my own" does: before the step is drawn (a run of the whole page or of the step's fragment alone) and once it is
drawn, the page's state is compared with the one it took from the leader (`check`); one that differs reruns the
whole page at once, whose banner then says so.

Session keys: follow_role ("lead" | "follow"), follow_secret (leader), follow_code, follow_mode (follower:
"following" | "alone" | "ended"), follow_seen (the version applied), follow_pending (a link to apply),
follow_error (why the store could not be used), follow_published (the leader's last published link),
follow_taken (the follower's state as taken from the leader, `followed_part`), follow_fresh (the leader's state
was just taken: the next check keeps the page's state as follow_taken).
"""

from __future__ import annotations

import html
import os
from collections.abc import Callable
from dataclasses import asdict
from urllib.parse import urlencode, urlsplit, urlunsplit

import segno
import streamlit as st

from ui import rooms
from ui.state import AppState, to_query
from ui.store import Store, StoreError, store_from_env

OWN = frozenset({"lang", "large"})  # a follower's own settings, never taken from the leader
POLL_SECONDS = 0.5  # a follower sees the leader's move within about this (plus its own redraw)
HEARTBEAT_SECONDS = 5.0  # well inside rooms.ROOM_TTL_SECONDS: a room outlives a missed beat or two
ss = st.session_state

# The QR code's box: as tall as most of a projected 720-pixel screen allows, on a white quiet zone so that a
# dark theme does not hide it; on a phone, the width of the screen.
QR_CSS = """<style>
.kv-follow-qr img { width: min(62vh, 100%); height: auto; display: block; background: #fff; image-rendering: pixelated; }
.kv-follow-link { font-size: 1.1rem; word-break: break-all; }
</style>"""
# Clear of the title's descenders above (the page's one-line title sits tight on what follows it).
SPACING_CSS = "<style>.st-key-follow-share, .st-key-follow-banner { margin-top: 0.4rem; }</style>"


@st.cache_resource(show_spinner=False)
def room_store() -> Store:
    """The process's one store (KVSCOPE_STORE); a misconfigured one raises StoreError, shown by the callers."""
    return store_from_env(os.environ)


def the_rooms() -> rooms.Rooms:
    return rooms.Rooms(room_store())


# -- before the widgets -------------------------------------------------------------------------


def take_over(apply: Callable[[dict[str, str]], None]) -> None:
    """Called at the top of every page draw, before any widget: the session's role from its link (first draw
    only), then the leader's pending state through `apply` (the leader's link parameters, `OWN` left out)."""
    if "follow_role" not in ss:
        begin(st.query_params.to_dict())
    if ss.follow_role == "lead":
        heartbeat()  # a draw holds back the timed heartbeat: its room's TTL starts afresh before it
    pending = ss.pop("follow_pending", None)
    if pending is not None and ss.get("follow_role") == "follow":
        apply(pending)
        ss.follow_fresh = True  # the next `check` sees the leader's state as this page fitted it


def followed_part(state: AppState) -> dict:
    """What following decides: the state but for the follower's own settings (`OWN`)."""
    return {name: value for name, value in asdict(state).items() if name not in OWN}


def check(state: AppState) -> None:
    """A following page about to draw the step (and again once drawn, for Play's ticks): the first check after
    taking the leader's state keeps `state` as what following looks like (the page may have fitted it: a case,
    the host's limits); a later `state` that differs was moved by its student, who has left following. The page
    is then drawn again from the top, where the banner says so."""
    if ss.get("follow_role") != "follow" or ss.get("follow_mode") != "following":
        return
    part = followed_part(state)
    if ss.pop("follow_fresh", False) or "follow_taken" not in ss:
        ss.follow_taken = part
    elif part != ss.follow_taken:
        leave()
        st.rerun(scope="app")


def begin(params: dict[str, str]) -> None:
    """Lead (`lead=` in the link, a reload resuming its room), follow (`follow=<code>`), or neither."""
    ss.follow_role = None
    if "lead" in params:
        ss.follow_role = "lead"
        ss.follow_secret, ss.follow_code = rooms.lead_or_resume(params["lead"])
    elif "follow" in params:
        ss.follow_role = "follow"
        ss.follow_code = params["follow"][:64]
        join()


def join() -> None:
    """Follow the leader from its current state on; if there is no room (or no store): say so, stay free."""
    ss.pop("follow_error", None)
    read_room(take_any=True)


def read_room(take_any: bool) -> bool:
    """Read the followed room: gone (or no store) ends following; a version not applied yet (any version, with
    `take_any`) becomes pending state. True when the page must be redrawn."""
    try:
        room = the_rooms().read(ss.follow_code)
    except StoreError as error:
        room, ss.follow_error = None, str(error)
    if room is None:
        ss.follow_mode = "ended"
        return True
    if take_any or room.version != ss.follow_seen:
        ss.follow_mode = "following"
        ss.follow_seen = room.version
        ss.follow_pending = room.query
        return True
    return False


def link_params() -> dict[str, str]:
    """What this session's own link carries besides its state: the leader's secret or the follower's code."""
    role = ss.get("follow_role")
    if role == "lead":
        return {"lead": ss.follow_secret}
    if role == "follow":
        return {"follow": ss.follow_code}
    return {}


def publish(state: AppState) -> None:
    """A leader's draw publishes its state as a link's parameters (others: nothing): without the leader's own
    language and text size, and with the prompt, model and chat switch always named (their defaults depend on the
    language)."""
    if ss.get("follow_role") != "lead":
        return
    named = {"prompt": state.prompt, "model": state.model, "chat": "1" if state.chat else "0"}
    query = {name: value for name, value in to_query(state).items() if name not in OWN} | named
    ss.follow_published = query
    send(query)


def send(query: dict[str, str]) -> None:
    """Publish `query` to the leader's room (a new version if it changed); a store failure is shown, not raised."""
    try:
        the_rooms().publish(ss.follow_secret, query)
        ss.pop("follow_error", None)
    except StoreError as error:
        ss.follow_error = str(error)


# -- on the page --------------------------------------------------------------------------------


def show(t: Callable[..., str]) -> None:
    """Below the title: the leader's panel, or the follower's banner (`t`: the page's string function)."""
    role = ss.get("follow_role")
    if role:
        st.html(SPACING_CSS)
    if role == "lead":
        leader_panel(t)
        timed(heartbeat, HEARTBEAT_SECONDS)
    elif role == "follow":
        follower_banner(t)
        if ss.follow_mode == "following":
            timed(poll, POLL_SECONDS)


def timed(check: Callable[[], None], seconds: float) -> None:
    """Run `check` now and every `seconds` as a fragment, inside a container of its own: a fragment that draws
    nothing takes no place in the page, and when its timed run ended Streamlit removed the element drawn next
    (the step counter) as if it were the fragment's."""
    with st.container():
        st.fragment(run_every=seconds)(check)()


def student_url() -> str:
    """The students' link: absolute when the browser told the server its address, else relative."""
    params = {"follow": ss.follow_code}
    if ss.get("w_lang", "en") != "en":
        params["lang"] = ss.w_lang  # students open in the class's language, then choose their own
    base = urlsplit(st.context.url or "")  # scheme, host and path; "" when the browser has not said
    return urlunsplit((base.scheme, base.netloc, base.path or ("/" if base.netloc else ""), urlencode(params), ""))


def leader_panel(t: Callable[..., str]) -> None:
    url = student_url()
    # A data URI: the page's HTML sanitizer keeps an <img> but strips an inline <svg> element.
    qr = segno.make(url, error="m").svg_data_uri(scale=1, border=3, omitsize=True, light="#fff")
    with st.expander(t("follow_share"), icon=":material/qr_code_2:", key="follow-share"):
        qr_column, text_column = st.columns([3, 2])
        qr_column.html(f"{QR_CSS}<div class='kv-follow-qr'><img src='{html.escape(qr)}' "
                       f"alt='{html.escape(t('follow_qr'))}'></div>")
        with text_column:
            with st.container(key="follow-link"):
                st.html(f"<div class='kv-follow-link'><a href='{html.escape(url)}' target='_blank'>"
                        f"{html.escape(url)}</a></div>")
            st.markdown(t("follow_share_help"))
            st.button(t("follow_end"), key="b_follow_end", on_click=end_room)
    if ss.get("follow_error"):
        st.warning(t("follow_lead_down", error=ss.follow_error))


def follower_banner(t: Callable[..., str]) -> None:
    with st.container(key="follow-banner"):
        message, button = st.columns([4, 1], vertical_alignment="center")
        if ss.follow_mode == "following":
            message.info(t("follow_following"), icon=":material/school:")
            button.button(t("follow_leave"), key="b_follow_leave", on_click=leave, width="stretch")
            return
        if ss.follow_mode == "alone":
            message.info(t("follow_alone"), icon=":material/explore:")
        elif ss.get("follow_error"):
            message.warning(t("follow_down", error=ss.follow_error))
        else:
            message.warning(t("follow_gone"))
        button.button(t("follow_return"), key="b_follow_return", on_click=join, width="stretch")


# -- timed and pressed --------------------------------------------------------------------------


def heartbeat() -> None:
    """The leader's room stays alive while its page is open (its state is republished as it is)."""
    if "follow_published" in ss:
        send(ss.follow_published)


def poll() -> None:
    """A follower's timed check of the room: the page is redrawn when the leader moved or the room is gone."""
    if ss.get("follow_mode") == "following" and read_room(take_any=False):  # a move of its own may have just left
        st.rerun(scope="app")


def leave() -> None:
    """Explore on my own: the page keeps its state; the leader's moves no longer change it."""
    ss.follow_mode = "alone"


def end_room() -> None:
    """The leader stops sharing: its room is deleted (followers see the class has ended) and its link drops
    the secret; the page goes on as a plain page."""
    try:
        the_rooms().end(ss.follow_secret)
    except StoreError as error:
        ss.follow_error = str(error)
        return
    ss.follow_role = None

"""Follow the teacher: the Streamlit side of `ui.follow.rooms`, through the process's `ui.follow.sync.RoomSync`.

A page opened with `lead=1` leads: it shows the students' link and its QR code, publishes its state on every
draw (`publish`, from the page's link writer) and, every second, refreshes its room and says whether students can
follow it (`lead_status`: the store failing, or another page on the same leader link has taken the room, with a
button to take it back). A page opened with `follow=<code>` follows: a fragment polls the room twice a second and,
when the leader's state changed, stores the leader's link as pending and reruns the page, which applies it before
any widget exists (`take_over`). Everything in the link is followed except the follower's own language and text
size (`OWN`). No page waits for the store: publishing and reading are the RoomSync thread's.

A follower whose room is gone or cannot be read waits for it (`waiting`): the poll goes on, and the page follows
again by itself, saying so, when the room is published again (the store back, the server restarted, the
teacher's page reloaded). A follower who moves on their own (a step button, Play, any setting but `OWN`) leaves
following, as "Explore on my own" does, and only "Follow the teacher again" brings it back: before the step is
drawn (a run of the whole page or of the step's fragment alone) and once it is drawn, the page's state is
compared with the one it took from the leader (`check`); one that differs reruns the whole page at once, whose
banner then says so.

One module for both sides (about 320 lines): the leader's and the follower's parts share the session keys below
and the room's state as a link (`room_query`), and each side reads the other's checks.

Session keys: follow_role ("lead" | "follow"), follow_secret and follow_page (leader: the room's secret, this
page's own id), follow_claim (the leader's next publish claims the room), follow_code, follow_mode (follower:
"following" | "alone" | "waiting"), follow_seen (the room's version and state applied), follow_rejoined (following
again by itself), follow_pending (a link to apply), follow_error (why the store could not be used),
follow_published (the leader's last published link), follow_taken (the follower's state as taken from the
leader, `followed_part`), follow_fresh (the leader's state was just taken: the next check keeps the page's state
as follow_taken).
"""

from __future__ import annotations

import html
import os
from collections.abc import Callable
from dataclasses import asdict
from urllib.parse import urlencode, urlsplit, urlunsplit

import segno
import streamlit as st

from ui import streamlit_internals
from ui.follow import push, rooms
from ui.follow.sync import RoomSync, Seen
from ui.state import AppState, parse_query, to_query
from ui.follow.store import StoreError, store_from_env

OWN = frozenset({"lang", "large"})  # a follower's own settings, never taken from the leader
# A follower's page runs as soon as this server's RoomSync reads a new state of its room (`ui.follow.push`); the poll is
# the safety net (a run that was asked for but lost), so it can be slow: a poll is a script run per follower.
POLL_SECONDS = float(os.environ.get("KVSCOPE_FOLLOW_POLL_S") or 3.0)
LEAD_SECONDS = 1.0  # the leader's heartbeat (well inside rooms.ROOM_TTL_SECONDS) and check of its status
JOIN_WAIT = 1.0  # a page waits at most this for a room's first read (opening a follow link, a throttled tab)
ss = st.session_state

# The QR code's box: as tall as most of a projected 720-pixel screen allows, on a white quiet zone so that a
# dark theme does not hide it; on a phone, the width of the screen.
QR_CSS = """<style>
.kv-follow-qr img { width: min(62vh, 100%); height: auto; display: block; background: #fff; image-rendering: pixelated; }
.kv-follow-link { font-size: 1.1rem; word-break: break-all; }
</style>"""
# Clear of the title's descenders above (the page's one-line title sits tight on what follows it).
SPACING_CSS = "<style>.st-key-follow-share, .st-key-follow-banner { margin-top: 0.4rem; }</style>"


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


# -- before the widgets -------------------------------------------------------------------------


def take_over(apply: Callable[[dict[str, str]], None]) -> None:
    """Called at the top of every page draw, before any widget: the session's role from its link (first draw
    only), then the leader's pending state through `apply` (the leader's link parameters, `OWN` left out)."""
    if "follow_role" not in ss:
        begin(st.query_params.to_dict())
    if ss.get("follow_role") == "follow" and ss.get("follow_mode") in ("following", "waiting"):
        refresh()  # a run pushed by the leader's move (`ui.follow.push`) applies it in this run
    pending = ss.pop("follow_pending", None)
    if pending is not None and ss.get("follow_role") == "follow":
        apply(pending)
        ss.follow_fresh = True  # the next `check` sees the leader's state as this page fitted it


def take_step() -> None:
    """At the top of the step's fragment of a following page (a run of the fragment alone, asked for by the
    leader's move, or the fragment within a run of the page): the leader's state as this server last read it. A
    change of the step alone is applied here; any other change is applied by a run of the whole page, before any
    widget exists (`take_over`)."""
    if ss.get("follow_role") != "follow" or ss.get("follow_mode") not in ("following", "waiting"):
        return
    following = ss.follow_mode == "following"
    # A waiting page that follows again changes its banner too: the leader's move then runs the whole page.
    push.listen_step(streamlit_internals.current_fragment_id() if following else None)
    refresh()
    pending = ss.get("follow_pending")
    if pending is None:
        return
    if following and "follow_shown" in ss and without_step(pending) == without_step(ss.follow_shown):
        ss.step = parse_query(pending)[0].step
        del ss.follow_pending
        ss.follow_fresh = True  # the next `check` keeps this step as the leader's
    else:
        st.rerun(scope="app")


def without_step(query: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in query.items() if name != "step"}


def followed_part(state: AppState) -> dict:
    """What following decides: the state but for the follower's own settings (`OWN`)."""
    return {name: value for name, value in asdict(state).items() if name not in OWN}


def check(state: AppState) -> None:
    """A following (or waiting) page about to draw the step (and again once drawn, for Play's ticks): the first
    check after taking the leader's state keeps `state` as what following looks like (the page may have fitted
    it: a case, the host's limits); a later `state` that differs was moved by its student, who has left following
    (and will not follow again by itself). The page is then drawn again from the top, where the banner says so."""
    if ss.get("follow_role") != "follow":
        return
    ss.follow_shown = room_query(state)  # a room that says the same is followed without a redraw (`poll`)
    if ss.get("follow_mode") not in ("following", "waiting"):  # waiting: a move of its own is exploring too
        return
    part = followed_part(state)
    if ss.pop("follow_fresh", False) or "follow_taken" not in ss:
        ss.follow_taken = part
    elif part != ss.follow_taken:
        leave()
        st.rerun(scope="app")


def begin(params: dict[str, str]) -> None:
    """Lead (`lead=` in the link, a reload resuming its room), follow (`follow=<code>`), or neither. A page that
    opens a leader's link claims its room: the newest page leads (the teacher's projector after their laptop)."""
    ss.follow_role = None
    if "lead" in params:
        ss.follow_role = "lead"
        ss.follow_secret, ss.follow_code = rooms.lead_or_resume(params["lead"])
        ss.follow_page, ss.follow_claim = rooms.new_page_id(), True
    elif "follow" in params:
        ss.follow_role = "follow"
        ss.follow_code = params["follow"][:64]
        join()


def join() -> None:
    """Follow the leader from its current state on (a page's first draw, "Follow the teacher again"); if there
    is no room (or no store): say so, and wait for it."""
    ss.pop("follow_error", None)
    ss.follow_mode = "waiting"
    room_sync = sync()
    seen = room_sync.watch(ss.follow_code, wait=JOIN_WAIT) if room_sync else Seen(None, ss.follow_error)
    follow_seen(seen or Seen(None), take_any=True)  # not read in time: waiting, and the poll goes on


def follow_seen(seen: Seen, take_any: bool = False) -> None:
    """Follow the room as last read: gone or unreadable, wait for it; a state not applied yet (any state, with
    `take_any`) becomes pending, and a waiting page that takes it says it follows again."""
    if seen.room is None:
        ss.follow_mode, ss.follow_error = "waiting", seen.error
        push.listen_step(None)  # following again changes the banner: the leader's next move runs the whole page
        return
    applied = (seen.room.version, seen.room.query)  # the version alone restarts at 1 on an emptied store
    if not take_any and ss.follow_mode == "following" and ss.get("follow_seen") == applied:
        return
    ss.follow_rejoined = ss.follow_mode == "waiting" and not take_any
    ss.follow_mode, ss.follow_seen, ss.follow_pending = "following", applied, seen.room.query
    ss.pop("follow_error", None)


def leading() -> bool:
    """This page leads a room (the teacher's)."""
    return ss.get("follow_role") == "lead"


def following() -> bool:
    """This page follows the teacher now (not on its own, not waiting for the room)."""
    return ss.get("follow_role") == "follow" and ss.get("follow_mode") == "following"


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
    ss.follow_published = room_query(state)
    send(ss.follow_published)


def room_query(state: AppState) -> dict[str, str]:
    """What a room holds of a page's state: its link's parameters without the page's own language and text size,
    and with the prompt, model and chat switch always named (their defaults depend on the language)."""
    named = {"prompt": state.prompt, "model": state.model, "chat": "1" if state.chat else "0"}
    return {name: value for name, value in to_query(state).items() if name not in OWN} | named


def send(query: dict[str, str], claim: bool = False) -> None:
    """Hand `query` to the process's RoomSync for the leader's room (it never waits for the store); the page's
    first publish claims the room."""
    room_sync = sync()
    if room_sync is not None:
        claim = ss.pop("follow_claim", False) or claim
        room_sync.publish(ss.follow_page, ss.follow_secret, query, claim=claim)


# -- on the page --------------------------------------------------------------------------------


def show(t: Callable[..., str]) -> None:
    """Below the title: the leader's panel, or the follower's banner (`t`: the page's string function)."""
    role = ss.get("follow_role")
    if role:
        st.html(SPACING_CSS)
    if role == "lead":
        leader_panel(t)
        timed(lead_status, LEAD_SECONDS, t)
    elif role == "follow":
        timed(follower_banner, None if ss.follow_mode == "alone" else POLL_SECONDS, t)


def timed(check: Callable[..., None], seconds: float | None, *args) -> None:
    """Run `check(*args)` now and every `seconds` (None: when its own buttons are pressed) as a fragment, inside a
    container of its own: a fragment that draws nothing takes no place in the page, and when its timed run ended
    Streamlit removed the element drawn next (the step counter) as if it were the fragment's."""
    with st.container():
        st.fragment(run_every=seconds)(check)(*args)


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


def follower_banner(t: Callable[..., str]) -> None:
    """The follower's banner, with its poll of the room (a fragment: a change of the banner alone, such as
    following again a room that shows what this page shows, needs no redraw of the page)."""
    poll()
    with st.container(key="follow-banner"):
        message, button = st.columns([4, 1], vertical_alignment="center")
        if ss.follow_mode == "following":
            message.info(t("follow_rejoined" if ss.get("follow_rejoined") else "follow_following"),
                         icon=":material/school:")
            button.button(t("follow_leave"), key="b_follow_leave", on_click=leave, width="stretch")
        elif ss.follow_mode == "alone":
            message.info(t("follow_alone"), icon=":material/explore:")
            button.button(t("follow_return"), key="b_follow_return", on_click=join, width="stretch")
        elif ss.get("follow_error"):  # waiting: the poll follows again by itself
            message.warning(t("follow_down", error=ss.follow_error))
        else:
            message.warning(t("follow_gone"))


# -- timed and pressed --------------------------------------------------------------------------


def lead_status(t: Callable[..., str]) -> None:
    """The leader's timed check: its room refreshed (the heartbeat: a page that lost the room sends nothing), and
    a warning when students cannot follow: the store fails, or another page took the room (with a button to
    take it back)."""
    room_sync = sync()
    if room_sync is None:
        st.warning(t("follow_lead_down", error=ss.follow_error))
        return
    if "follow_published" in ss:
        send(ss.follow_published)
    if not room_sync.leads(ss.follow_page):
        st.warning(t("follow_superseded"), icon=":material/cast:")
        st.button(t("follow_take_back"), key="b_follow_take_back", on_click=take_back)
    elif room_sync.error:
        st.warning(t("follow_lead_down", error=room_sync.error))


def take_back() -> None:
    """This page leads again: it claims the room (the page that had it is told at its next check)."""
    if "follow_published" in ss:
        send(ss.follow_published, claim=True)
    else:
        ss.follow_claim = True


def refresh() -> None:
    """Follow the room as the RoomSync thread last read it (no store call here)."""
    room_sync = sync()
    if room_sync is not None and ss.get("follow_mode") in ("following", "waiting"):  # not after a move of its own
        seen = room_sync.watch(ss.follow_code, wait=JOIN_WAIT)  # waits only for a room not read lately
        if seen is not None:
            follow_seen(seen)


def poll() -> None:
    """A follower's timed check of the room, and of a press of "Follow the teacher again": the page is redrawn when
    the leader's state is not the one it shows."""
    push.listen(ss.follow_code if ss.get("follow_mode") in ("following", "waiting") else None)
    refresh()
    if ss.get("follow_pending") is None:
        return
    if ss.follow_pending == ss.get("follow_shown"):
        del ss.follow_pending  # the page shows the leader's state already: only the banner changes
        ss.follow_fresh = True
    else:
        st.rerun(scope="app")  # the leader's state is applied before any widget exists


def leave() -> None:
    """Explore on my own: the page keeps its state; the leader's moves no longer change it."""
    ss.follow_mode = "alone"


def end_room() -> None:
    """The leader stops sharing: its room is deleted (followers see the class has ended and wait for one) and its
    link drops the secret; the page goes on as a plain page. A page that no longer leads leaves the room be."""
    room_sync = sync()
    if room_sync is not None and room_sync.leads(ss.follow_page):
        room_sync.end(ss.follow_page, ss.follow_secret)
    ss.follow_role = None

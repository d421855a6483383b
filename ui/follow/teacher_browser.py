"""What the projector must not show, kept in the teacher's browser, and the address phones can reach.

- **The leader's secret** lives in a cookie of the teacher's browser, never in the page's link: the projected
  address bar reads `lead=1`, and a student who types it opens a room of their own. A reload (even after a server
  restart) sends the cookie, so the teacher's page resumes its room; "Stop sharing" forgets it.
- **The students' link** is built from the address the teacher's browser used, unless that address is this machine's
  own (`localhost`, 127.0.0.0/8, ::1), which no phone can open: then it names the machine's address on the room's
  network, or says why there is none. `KVSCOPE_PUBLIC_URL` names the address outright (behind a proxy, on a host).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from urllib.parse import urlsplit

import streamlit as st

COOKIE = "kvscope_lead"
KEEP_SECONDS = 12 * 3600  # a school day: a room resumes from the cookie within it
PUBLIC_URL_ENV = "KVSCOPE_PUBLIC_URL"
LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
HIDDEN = (
    '<style>[data-testid="stElementContainer"]:has(.kv-cookie) { display: none; }</style>'
    '<span class="kv-cookie"></span>'
)


def remembered() -> str | None:
    """What this browser's cookie holds, if anything (`rooms.lead_or_resume` takes it only if shaped like a secret;
    AppTest's context is a mock, not a string)."""
    return st.context.cookies.get(COOKIE)


def remember(secret: str) -> None:
    """Keep `secret` in this browser (drawn by the leading page; a secret's characters are URL-safe)."""
    set_cookie(COOKIE, secret, KEEP_SECONDS)


def forget() -> None:
    set_cookie(COOKIE, "", 0)


def set_cookie(name: str, value: str, seconds: int) -> None:
    """A script that sets cookie `name` (its value URL-safe), in an element that takes no place (drawn in the leader's
    strip, it pushed the strip down over the page's title)."""
    st.html(
        f"{HIDDEN}<script>document.cookie = '{name}={value}; path=/; max-age={seconds}; samesite=strict'"
        " + (location.protocol === 'https:' ? '; secure' : '');</script>",
        unsafe_allow_javascript=True,
    )


def is_local(host: str) -> bool:
    """Whether `host` names this machine only (no other device can open it)."""
    if host.lower() in LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def network_address() -> str | None:
    """This machine's address on its network: the source address of its default route. A UDP socket's connect only
    picks the route, it sends nothing. None without a route or when that address is a loopback one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))
            address = probe.getsockname()[0]
        except OSError:
            return None
    return None if ipaddress.ip_address(address).is_loopback else address


def students_base(page_url: str, listens_on: str | None, environ=os.environ) -> tuple[str, str | None, dict]:
    """The base of the students' link (scheme, host, port and path) and, when phones cannot open the page's own
    address, a string key and its fields saying so: `page_url` is the address the teacher's browser used, `listens_on`
    the server's `server.address` (None or "": every interface)."""
    public = environ.get(PUBLIC_URL_ENV, "").strip()
    if public:
        parts = urlsplit(public)
        if parts.scheme in ("http", "https") and parts.netloc:
            return public, None, {}
        return page_url, "follow_public_url_bad", {"name": PUBLIC_URL_ENV, "value": public}
    parts = urlsplit(page_url)
    host = parts.hostname or ""
    if not is_local(host):
        return page_url, None, {}
    shown = {"host": host, "name": PUBLIC_URL_ENV}
    if listens_on and is_local(listens_on):
        return page_url, "follow_local_only", shown
    address = network_address()
    if address is None:
        return page_url, "follow_local_no_network", shown
    netloc = f"{address}:{parts.port}" if parts.port else address
    return parts._replace(netloc=netloc).geturl(), "follow_local_moved", shown | {"address": address}

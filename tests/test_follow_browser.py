"""Follow the teacher in headless Chromium: a leader and two followers (three browser contexts, three sessions on
one server). Each follower must show the leader's step and answer text after each of the leader's moves (how soon:
bench/browser_latency.py, its `follow` part). Needs Debian's chromium and the `playwright` package, as
tests/test_browser.py."""

import html
import ipaddress
import socket
from urllib.parse import parse_qs, urlparse

import psutil
import pytest
import segno
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import expect

from tests.helpers import IDLE, WAIT_MS, Received, leader_secret, link, press
from tests.server import running_server, settled_text
from ui.follow import rooms, teacher_browser
from ui.text import strings

pytestmark = pytest.mark.browser


# What a student compares: the step counter, the view chosen and the answer text. (The link is written last in
# a draw, after the view's figures; it is compared once the run has finished.)
SHOWN = """() => {
    const counter = document.querySelector('.kv-counter'), code = document.querySelector('.st-key-generated code');
    const view = document.querySelector('.st-key-w_view label:has(input:checked)');
    return {counter: counter ? counter.innerText : null, view: view ? view.innerText.trim() : null,
            text: code ? code.textContent : null}; }"""


def shown(page) -> dict[str, str]:
    """What `page` shows once its run has finished (its link then says the same step)."""
    settled_text(page)
    return page.evaluate(SHOWN)


def shows(page, expected: dict[str, str], timeout_ms: int = WAIT_MS) -> None:
    """Wait until `page` shows `expected` (from `shown`); else fail saying what it shows (`timeout_ms`: a harness
    timeout, that only keeps a hung test from hanging)."""
    try:
        page.wait_for_function(
            f"e => {{ const now = ({SHOWN})(); "
            "return now.counter === e.counter && now.view === e.view && now.text === e.text; }",
            arg=expected,
            timeout=timeout_ms,
        )
    except PlaywrightTimeout:
        state = page.locator('[data-testid="stApp"]').get_attribute("data-test-script-state")
        alerts = page.locator('[data-testid="stAlert"], [data-testid="stException"]').all_inner_texts()
        raise AssertionError(
            f"after {timeout_ms} ms the page ({state}, alerts {alerts}) shows {page.evaluate(SHOWN)}, not {expected}"
        ) from None


def leader_moves(leader, key: str, **expected_link) -> dict[str, str]:
    """Press a step button on the leader's page; what it shows once its run has finished."""
    press(leader, key)
    condition = " && ".join(f"p.get({name!r}) === {value!r}" for name, value in expected_link.items())
    try:
        leader.wait_for_function(
            f"() => {{ const p = new URL(location.href).searchParams; return {condition}; }}", timeout=WAIT_MS
        )
    except PlaywrightTimeout:  # seen once (a full run): the link a step behind what the followers showed
        state = leader.locator('[data-testid="stApp"]').get_attribute("data-test-script-state")
        raise AssertionError(
            f"the leader's link is not {expected_link} but {leader.url}; the page ({state}) shows "
            f"{leader.evaluate(SHOWN)}"
        ) from None
    return shown(leader)


@pytest.fixture(scope="module")
def slow_polls_server(tmp_path_factory):
    """A server whose followers poll every 600 s: what reaches a follower within a test came by a push or a
    press, never by its poll."""
    log = tmp_path_factory.mktemp("slow-polls") / "server.log"
    with running_server(log, env={"KVSCOPE_FOLLOW_POLL_S": "600"}) as (url, _):
        yield url


def open_class(url: str, leader, followers, query: str = "") -> None:
    """The leader opens a room (`query`: more of its link) and each follower opens its students' link and shows
    what the leader shows."""
    leader.goto(f"{url}/?lead=1{query}")
    settled_text(leader)
    href = leader.locator(".st-key-follow-link a").get_attribute("href")
    for follower in followers:
        follower.goto(href)
        settled_text(follower)  # a page's first draw (a new browser context loads Streamlit and Plotly: seconds)
        shows(follower, shown(leader))
        expect(follower.get_by_text(strings.t("follow_following"))).to_be_visible()


def class_follows(leader, followers, steps: int, view: str, sent=None) -> None:
    """The leader presses → `steps` times from step 0, then picks `view`: after each move every follower shows
    what the leader shows. `sent` (a `Received`, of the first follower): a step's move sends that follower the new
    step and no widget of the sidebar (its step alone ran, not the whole page), a change of view the sidebar too."""
    for step in range(1, steps + 1):
        if sent is not None:
            sent.clear()
        now = leader_moves(leader, "b_next", step=str(step))
        for follower in followers:
            shows(follower, now)
        if sent is not None:
            assert sent.carries('kv-counter">' + html.escape(now["counter"])), step  # the step's header came
            assert not sent.carries("w_top_p"), step  # and no sidebar widget (top-p's key) with it
    if sent is not None:
        sent.clear()
    leader.wait_for_selector(IDLE, timeout=WAIT_MS)
    leader.locator(".st-key-w_view label", has_text=strings.t("view_" + view)).click()
    leader.wait_for_function(f"() => new URL(location.href).searchParams.get('view') === '{view}'", timeout=WAIT_MS)
    now = shown(leader)
    for follower in followers:
        shows(follower, now)
    if sent is not None:
        assert sent.carries("w_top_p")  # the view changed: the whole page ran, its sidebar with it


def test_two_followers_follow_by_the_leaders_push_until_each_explores_on_its_own(slow_polls_server, pages):
    """One class on a server whose followers poll every 600 s, so what reaches a follower came by the leader's push
    (ui/follow/push.py) or by its own press, never by its poll:
    - the leader's link and QR code; both followers follow it, and a move of the step runs a follower's step alone:
      what the follower is sent holds the new step and none of the sidebar's widgets (a run of the whole page sends
      them all; a change of view still does);
    - the first leaves by its button: it stays where it was while the other follows, its presses are its own, and it
      returns;
    - the second presses Next: it is told at once, by the press's own run (how soon: bench/browser_latency.py, its
      `follow` part), and stays at its own step while the teacher moves on, until it returns."""
    leader, first, second = pages
    sent, sent_second = Received(first), Received(second)  # what the server sends each
    leader.goto(f"{slow_polls_server}/?lead=1")
    settled_text(leader)
    secret = leader_secret(leader)
    assert link(leader)["lead"] == "1"
    href = leader.locator(".st-key-follow-link a").get_attribute("href")
    assert href.startswith(slow_polls_server + "/?follow=") and secret not in href  # absolute: the browser's address
    assert rooms.is_code(parse_qs(urlparse(href).query)["follow"][0])
    assert leader.locator(".st-key-follow-share .kv-follow-qr img").count() == 1  # the QR code
    for follower in (first, second):
        follower.goto(href)
        settled_text(follower)
        expect(follower.get_by_text(strings.t("follow_following"))).to_be_visible()
        shows(follower, shown(leader))
        assert "lead" not in link(follower) and secret not in follower.content()

    class_follows(leader, (first, second), steps=4, view="attention", sent=sent)
    for follower in (first, second):  # and once its draw has finished, its link says so too
        settled_text(follower)
        assert {k: link(follower).get(k) for k in ("step", "view")} == {"step": "4", "view": "attention"}

    press(first, "b_follow_leave")
    expect(first.get_by_text(strings.t("follow_alone"))).to_be_visible(timeout=WAIT_MS)
    own, own_step = shown(first), link(first)["step"]
    sent.clear()
    for step in ("5", "6"):
        now = leader_moves(leader, "b_next", step=step)
        shows(second, now)
    # Each move reached the second by the push that asks every page following the room to run at once
    # (ui/follow/push.py's `notify`): had the first still followed, it would have been asked too, and sent that run.
    assert shown(first) == own and link(first)["step"] == own_step == "4"
    assert not sent.frames, f"the first was sent {len(sent.frames)} messages: it was asked to run"
    press(first, "b_back")  # its presses are its own
    first.wait_for_function("s => new URL(location.href).searchParams.get('step') === s", arg="3", timeout=WAIT_MS)
    press(first, "b_follow_return")
    shows(first, now)
    expect(first.get_by_text(strings.t("follow_following"))).to_be_visible()

    press(second, "b_next")
    expect(second.get_by_text(strings.t("follow_alone"))).to_be_visible(timeout=WAIT_MS)
    expect(second.locator(".st-key-b_follow_return button")).to_be_visible()
    second.wait_for_function("() => new URL(location.href).searchParams.get('step') === '7'", timeout=WAIT_MS)
    own = shown(second)
    sent_second.clear()
    for step in ("7", "8"):  # the teacher moves on; the first follows
        now = leader_moves(leader, "b_next", step=step)
        shows(first, now)
    assert shown(second) == own and link(second)["step"] == "7"
    assert not sent_second.frames, f"the second was sent {len(sent_second.frames)} messages"  # as the first
    expect(second.get_by_text(strings.t("follow_alone"))).to_be_visible()
    expect(first.get_by_text(strings.t("follow_following"))).to_be_visible()
    press(second, "b_follow_return")
    shows(second, now)


def test_an_unknown_follow_code_says_so_in_the_browser(server, pages):
    page = pages[0]
    page.goto(f"{server}/?follow={'A' * rooms.CODE_CHARS}&step=1&lang=zh")
    settled_text(page)
    expect(page.get_by_text(strings.t("follow_gone", "zh"))).to_be_visible()
    assert page.locator('[data-testid="stException"]').count() == 0


def test_the_leader_stops_sharing_and_its_followers_are_told(server, pages):
    leader, follower = pages[:2]
    open_class(server, leader, (follower,), "&step=1")
    leader.locator(".st-key-follow-share summary").click()  # the panel with the link and the QR code
    press(leader, "b_follow_end")
    leader.wait_for_function("() => !new URL(location.href).searchParams.has('lead')", timeout=WAIT_MS)
    expect(leader.locator(".st-key-follow-link")).to_have_count(0)
    expect(follower.get_by_text(strings.t("follow_gone"))).to_be_visible(timeout=WAIT_MS)
    assert follower.locator('[data-testid="stException"]').count() == 0


def test_a_page_opened_as_localhost_links_phones_to_the_machines_network_address(tmp_path, page):
    """A server listening on every interface, its teacher's page opened as `localhost`: the students' link and its QR
    code name one of this machine's own network addresses (as the OS lists them), on the server's port, and the strip
    says why; without any network address, it says that instead. Nothing connects to that address."""
    with running_server(tmp_path / "log.txt", address="0.0.0.0") as (url, _):
        port = urlparse(url).port
        page.goto(f"http://localhost:{port}/?lead=1&step=1")
        settled_text(page)
        page.locator(".st-key-follow-share summary").click()
        href = page.locator(".st-key-follow-link a").get_attribute("href")
        qr = page.locator(".st-key-follow-share .kv-follow-qr img").get_attribute("src")
        assert qr == segno.make(href, error="m").svg_data_uri(scale=1, border=3, omitsize=True, light="#fff")
        own = {
            a.address
            for addresses in psutil.net_if_addrs().values()
            for a in addresses
            if a.family == socket.AF_INET and not ipaddress.ip_address(a.address).is_loopback
        }
        alert = page.locator('[data-testid="stAlert"]')
        name = teacher_browser.PUBLIC_URL_ENV
        if not own:
            expect(
                alert.filter(has_text=plain_start(strings.t("follow_local_no_network", host="localhost", name=name)))
            ).to_be_visible()
            return
        link_to = urlparse(href)
        assert link_to.hostname in own and link_to.port == port and "follow" in parse_qs(link_to.query)
        said = strings.t("follow_local_moved", host="localhost", name=name, address=link_to.hostname)
        expect(alert.filter(has_text=plain_start(said))).to_be_visible()


def plain_start(markdown: str) -> str:
    """The start of a message as the page shows it: up to its first code span, Markdown escapes gone."""
    return str(markdown).replace("\\", "").split("`")[0]


def test_nothing_the_projector_shows_lets_a_student_lead(server, pages):
    """The teacher's projected page, opened as 127.0.0.1 on a server that listens on loopback only:
    - its address bar reads `lead=1`; no text, link or image on it holds the room's secret (a cookie of the teacher's
      browser); its QR code encodes the students' link, and the strip says phones cannot reach this server;
    - a student's browser that opens the projected address (a round open in it) leads a room of its own: what it
      presses there (reveal, ask again, ask) changes nothing in the class's round, the class keeps following the
      teacher, and the teacher's page still leads;
    - the teacher's reload resumes its room (the same students' code); "Stop sharing" forgets the secret."""
    teacher, student, classmate = pages
    teacher.goto(f"{server}/?lead=1&step=1")
    settled_text(teacher)
    secret = leader_secret(teacher)
    assert link(teacher)["lead"] == "1" and secret not in teacher.url
    teacher.locator(".st-key-follow-share summary").click()  # the panel with the link and the QR code, as projected
    href = teacher.locator(".st-key-follow-link a").get_attribute("href")
    code = parse_qs(urlparse(href).query)["follow"][0]
    qr = teacher.locator(".st-key-follow-share .kv-follow-qr img").get_attribute("src")
    assert qr == segno.make(href, error="m").svg_data_uri(scale=1, border=3, omitsize=True, light="#fff")
    host = urlparse(server).hostname
    warning = strings.t("follow_local_only", host=host, name=teacher_browser.PUBLIC_URL_ENV)
    expect(teacher.locator('[data-testid="stAlert"]', has_text=plain_start(warning))).to_be_visible()
    shown_anywhere = [
        teacher.inner_text("body"),
        teacher.url,
        qr,
        *teacher.eval_on_selector_all("a[href], img[src]", "els => els.map(e => e.href || e.src)"),
    ]
    assert not [where for where in shown_anywhere if secret in where]
    teacher.locator(".st-key-follow-share summary").click()  # closed: the panel lies over the page when open

    classmate.goto(href)
    settled_text(classmate)
    press(teacher, "b_ask_open")  # the class's round, open
    teacher.wait_for_function("() => new URL(location.href).searchParams.get('ask') !== null", timeout=WAIT_MS)
    asked = link(teacher)["ask"]
    expect(classmate.locator(".st-key-ask input")).to_be_visible(timeout=WAIT_MS)
    student.goto(teacher.url)  # typed from the projector, round and all
    settled_text(student)
    assert leader_secret(student) != secret
    own = student.locator(".st-key-follow-link a").get_attribute("href")
    assert parse_qs(urlparse(own).query)["follow"][0] != code  # a room of its own
    for control in ("b_ask_reveal", "b_ask_again", "b_ask_open"):  # its own room's round: reveal, again, reset
        if student.locator(f".st-key-{control} button").count():
            press(student, control)
            settled_text(student)
    assert (link(teacher)["ask"], link(teacher).get("ask_phase", "open")) == (asked, "open")
    expect(classmate.locator(".st-key-ask input")).to_be_visible()  # the class's round is still open, unrevealed
    assert classmate.locator(".st-key-ask .js-plotly-plot").count() == 0
    now = leader_moves(teacher, "b_next", step="2")
    shows(classmate, now)  # the class still follows the teacher
    expect(teacher.get_by_text(strings.t("follow_superseded"))).to_have_count(0)

    teacher.reload()
    settled_text(teacher)
    assert link(teacher)["lead"] == "1" and leader_secret(teacher) == secret
    assert teacher.locator(".st-key-follow-link a").get_attribute("href") == href
    now = leader_moves(teacher, "b_next", step="3")
    shows(classmate, now)
    teacher.locator(".st-key-follow-share summary").click()
    press(teacher, "b_follow_end")
    teacher.wait_for_function(f"() => !document.cookie.includes('{teacher_browser.COOKIE}=')", timeout=WAIT_MS)

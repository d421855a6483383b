"""Follow the teacher (ui/follow/): a page opened with lead=1 shares a students' link; pages opened with it
follow the leader's state until they choose to explore on their own.

AppTest pages in one process share the process's room store, as browser sessions on one server do; the
browser tests drive a leader and two followers on a real server (three browser contexts).
"""

import html
import re
from dataclasses import replace
from urllib.parse import parse_qs, urlparse

import pytest
import redis

from tests.app_helpers import assert_clean, keeps_working, secret_of, shown_text, start, step_of
from ui.follow import room_link, rooms
from ui.lesson.chapters import number_of
from ui.runs import turns
from ui.state.link import AppState, parse_query
from ui.text import strings


def follow_link(at) -> str:
    """The href inside the container keyed `follow-link`."""

    def blocks(node):
        yield node
        for child in getattr(node, "children", {}).values():
            yield from blocks(child)

    found = [b for b in blocks(at._tree) if str(getattr(getattr(b, "proto", None), "id", "")).endswith("-follow-link")]
    assert len(found) == 1, "no follow-link container"
    bodies = [e.proto.body for e in blocks(found[0]) if getattr(e, "type", "") == "html"]
    hrefs = [html.unescape(m) for body in bodies for m in re.findall(r"href='([^']*)'", body)]
    assert len(hrefs) == 1, bodies
    return hrefs[0]


def code_in(link: str) -> str:
    params = parse_qs(urlparse(link).query)
    assert set(params) <= {"follow", "lang"}, params
    return params["follow"][0]


def everything_shown(at) -> str:
    kinds = ("markdown", "caption", "info", "warning", "code", "html", "text")
    return " ".join(
        str(getattr(e, "value", "")) + getattr(getattr(e, "proto", None), "body", "")
        for kind in kinds
        for e in at.get(kind)
    )


def link_of(at) -> dict[str, str]:
    return dict(at.query_params)


def state_of(at) -> AppState:
    """The state a page's link describes, but for its own language and text size."""
    state, problems = parse_query(link_of(at))
    assert not problems
    return replace(state, lang="en", large=False)


def settle() -> None:
    """Wait for the process's RoomSync thread to send every page's state and read every watched room (a page
    hands both to that thread and never waits for the store)."""
    assert room_link.room_sync().settle(timeout=10)


@pytest.fixture
def leader(embedded_model):
    at = start(lead=1, step=2, view="attention")
    assert_clean(at)
    settle()
    return at


def test_lead_1_shows_a_students_link_with_a_code_and_never_the_secret(leader):
    secret = secret_of(leader)
    assert rooms.is_secret(secret) and leader.query_params["lead"] == "1"  # the projected link names no room
    link = follow_link(leader)
    code = code_in(link)
    assert rooms.is_code(code) and code not in secret and secret not in link
    assert secret not in everything_shown(leader).replace(f"kvscope_lead={secret};", "")  # but the cookie's script
    room = room_link.the_rooms().read(code)  # what a student's page will read: the leader's link, no secret
    assert room is not None and parse_query(room.query) == (state_of(leader), [])
    assert "large" not in room.query  # a follower's own setting, not the leader's to set
    assert room.query["lang"] == "en"  # the class's language: only a follow link naming none takes it, once
    assert secret not in str(room)
    assert any("data:image/svg+xml" in h.proto.body for h in leader.html)  # the QR code beside the link


def test_the_teachers_own_link_resumes_its_code_and_lead_1_in_another_browser_opens_another(leader):
    """A link naming the secret (a teacher's own, kept off the projector) resumes the room and then reads `lead=1`;
    `lead=1` in a browser without the room's cookie (AppTest sends none) opens a room of its own."""
    secret, code = secret_of(leader), code_in(follow_link(leader))
    reloaded = start(lead=secret, step=2)
    assert reloaded.query_params["lead"] == "1" and code_in(follow_link(reloaded)) == code
    assert secret_of(reloaded) == secret
    other = start(lead=1)
    assert code_in(follow_link(other)) != code and secret_of(other) != secret


def test_a_follower_takes_the_leaders_state_and_keeps_its_own_language(leader):
    follower = start(follow=code_in(follow_link(leader)), lang="zh", large=1, step=7)
    assert_clean(follower)
    assert state_of(follower) == state_of(leader)
    assert link_of(follower)["lang"] == "zh" and link_of(follower)["large"] == "1"
    assert shown_text(follower) == shown_text(leader)
    assert [i.value for i in follower.info if i.value == strings.t("follow_following", "zh")]
    for move in ("b_next", "b_next", "b_back"):
        leader.button(key=move).click().run()
        settle()
        follower.run()  # a full run draws the poll too, as the timed fragment would
        assert step_of(follower) == step_of(leader) and shown_text(follower) == shown_text(leader)
    leader.radio(key="w_view").set_value("kv").run()
    settle()
    follower.run()
    assert follower.query_params["view"] == "kv"
    assert "follow" in follower.query_params and "lead" not in follower.query_params


def test_a_follower_that_leaves_keeps_its_state_and_can_catch_up(leader):
    follower = start(follow=code_in(follow_link(leader)))
    follower.button(key="b_follow_leave").click().run()
    assert_clean(follower)
    stayed = (step_of(follower), shown_text(follower))
    leader.button(key="b_next").click().run()
    settle()
    leader.button(key="b_next").click().run()
    settle()
    follower.run()
    assert (step_of(follower), shown_text(follower)) == stayed and step_of(leader) == stayed[0] + 2
    follower.button(key="b_back").click().run()  # its presses are its own
    assert step_of(follower) == stayed[0] - 1
    follower.button(key="b_follow_return").click().run()
    assert state_of(follower) == state_of(leader) and shown_text(follower) == shown_text(leader)
    assert follower.button(key="b_follow_leave")  # following again


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_an_unknown_follow_code_says_so_and_the_page_works_alone(lang, embedded_model):
    for code in ("A" * rooms.CODE_CHARS, "not a code <b>", ""):
        at = start(follow=code, lang=lang, step=1)
        assert_clean(at)
        assert [w.value for w in at.warning] == [strings.t("follow_gone", lang)]
        keeps_working(at)


def test_followers_see_the_end_of_the_class_and_keep_their_state(leader):
    follower = start(follow=code_in(follow_link(leader)))
    leader.button(key="b_follow_end").click().run()
    settle()
    assert "lead" not in leader.query_params  # the leader's page goes on as a plain page
    kept = step_of(follower)
    follower.run()
    assert_clean(follower)
    assert [w.value for w in follower.warning] == [strings.t("follow_gone")]
    assert step_of(follower) == kept
    keeps_working(follower)


def test_a_follower_on_another_server_follows_through_redis(redis_url, monkeypatch, embedded_model):
    """KVSCOPE_STORE names Redis: the leader's state goes through it (read here with a client of our own), and
    a follower whose process holds a new store (another server) follows."""
    monkeypatch.setenv("KVSCOPE_STORE", redis_url)
    room_link.room_sync.clear()
    try:
        leader = start(lead=1, step=3)
        settle()
        code = code_in(follow_link(leader))
        raw = redis.Redis.from_url(redis_url, decode_responses=True).get(rooms.KEY_PREFIX + code)
        assert raw is not None and secret_of(leader) not in raw
        room_link.room_sync.clear()  # the other server's own connection
        follower = start(follow=code)
        assert state_of(follower) == state_of(leader) and shown_text(follower) == shown_text(leader)
    finally:
        monkeypatch.delenv("KVSCOPE_STORE")
        room_link.room_sync.clear()


def test_an_unusable_store_is_a_message_not_a_traceback(monkeypatch, embedded_model):
    from tests.server import free_port

    monkeypatch.setenv("KVSCOPE_STORE", f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    room_link.room_sync.clear()
    try:
        leader = start(lead=1, step=1)
        assert not leader.exception
        settle()  # the RoomSync thread's first try fails (nothing listens)
        leader.run()  # the warning shows from the draw after a failed publish
        assert any("Redis" in w.value for w in leader.warning)
        follower = start(follow="A" * rooms.CODE_CHARS, step=1)
        assert not follower.exception and any("Redis" in w.value for w in follower.warning)
        keeps_working(follower)
        monkeypatch.setenv("KVSCOPE_STORE", "http://nowhere")
        room_link.room_sync.clear()
        bad = start(follow="A" * rooms.CODE_CHARS, step=1)
        assert not bad.exception and any("KVSCOPE" in w.value for w in bad.warning)
    finally:
        monkeypatch.delenv("KVSCOPE_STORE")
        room_link.room_sync.clear()


def test_a_follower_in_english_follows_a_chinese_leaders_default_prompt(embedded_model):
    """The leader's link names no prompt (the Chinese default): the follower still runs the leader's prompt."""
    leader = start(lead=1, lang="zh", step=2)
    assert "prompt" not in leader.query_params
    link = follow_link(leader)
    assert parse_qs(urlparse(link).query)["lang"] == ["zh"]  # students open in the class's language …
    follower = start(follow=code_in(link), lang="en")  # … and may choose their own
    assert_clean(follower)
    assert shown_text(follower) == shown_text(leader) and "什么是" in shown_text(follower)
    assert "lang" not in follower.query_params  # English: the default, not in the link


def banner(at) -> str:
    """The follower's banner: following, exploring on its own, or the class gone."""
    shown = [i.value for i in at.info] + [w.value for w in at.warning]
    states = {key: strings.t(key) for key in ("follow_following", "follow_alone", "follow_gone")}
    found = [key for key, text in states.items() if text in shown]
    assert len(found) == 1, shown
    return found[0]


MOVES = {  # a student's own moves: a step button, Play, a view, a setting, a chapter
    "next": lambda at: at.button(key="b_next").click(),
    "back": lambda at: at.button(key="b_back").click(),
    "play": lambda at: at.toggle(key="p_playing").set_value(True),
    "view": lambda at: at.radio(key="w_view").set_value("kv"),
    "temperature": lambda at: at.slider(key="w_temperature").set_value(0.5),
    "block size": lambda at: at.number_input(key="w_block_size").set_value(8),
    "lesson": lambda at: at.button(key="b_lesson_start").click(),
}


@pytest.mark.parametrize("move", MOVES)
def test_a_follower_who_moves_on_its_own_is_told_it_left_and_stays_where_it_went(leader, move):
    follower = start(follow=code_in(follow_link(leader)))
    assert banner(follower) == "follow_following"
    taken = state_of(follower)
    MOVES[move](follower).run()
    assert_clean(follower)
    assert banner(follower) == "follow_alone" and follower.button(key="b_follow_return")
    follower.toggle(key="p_playing").set_value(False).run()  # (a student who pressed Play stops it)
    own = state_of(follower)
    assert own != taken
    for _ in range(2):  # the teacher moves on: the student's page stays its own
        leader.button(key="b_next").click().run()
        settle()
        follower.run()
        assert state_of(follower) == own and banner(follower) == "follow_alone"
    follower.button(key="b_follow_return").click().run()
    assert state_of(follower) == state_of(leader) and banner(follower) == "follow_following"
    follower.run()
    assert banner(follower) == "follow_following"  # taking the teacher's state is not a move of its own


def test_a_follower_keeps_following_through_its_own_language_and_the_teachers_case_chapter(leader):
    follower = start(follow=code_in(follow_link(leader)))
    follower.selectbox(key="w_lang").set_value("zh").run()
    follower.toggle(key="w_large").set_value(True).run()
    assert [i.value for i in follower.info if i.value == strings.t("follow_following", "zh")]
    leader.button(key="b_lesson_start").click().run()  # chapter 1
    case1 = number_of("prefix_case1")
    for moves in (("b_chapter_next",) * (case1 - 1), ("b_next", "b_next"), ("b_chapter_next", "b_chapter_back")):
        for key in moves:  # the teacher reaches Case 1 (the page fits its state), steps, leaves and comes back
            leader.button(key=key).click().run()
            settle()
        follower.run()
        assert_clean(follower)
        assert state_of(follower) == state_of(leader)
        assert [i.value for i in follower.info if i.value == strings.t("follow_following", "zh")], (
            [i.value for i in follower.info],
            [w.value for w in follower.warning],
        )


def lang_of(at) -> str:
    return at.query_params.get("lang", "en")  # the link names the language unless it is English


def test_a_plain_follow_link_opens_in_the_class_language_then_keeps_the_students_own(embedded_model):
    """`?follow=<code>` typed by hand (no `lang=`) opens in the teacher's language; after that the language is the
    student's: the teacher changing theirs does not move it, nor does a student's link that named one."""
    teacher = start(lead=1, lang="zh", step=2)
    settle()
    code = code_in(follow_link(teacher))
    plain, named = start(follow=code), start(follow=code, lang="en")
    assert (lang_of(plain), lang_of(named)) == ("zh", "en")
    assert [i.value for i in plain.info if i.value == strings.t("follow_following", "zh")]
    assert state_of(plain) == state_of(teacher) == state_of(named)
    teacher.selectbox(key="w_lang").set_value("en").run()
    teacher.button(key="b_next").click().run()
    settle()
    for follower in (plain, named):
        follower.run()
        assert_clean(follower)
        assert state_of(follower) == state_of(teacher)
    assert (lang_of(plain), lang_of(named)) == ("zh", "en")
    assert [i.value for i in plain.info if i.value == strings.t("follow_following", "zh")]


def test_followed_part_leaves_out_the_followers_own_settings_only():
    state = AppState(step=3, view="kv")
    assert room_link.followed_part(replace(state, lang="zh", large=True)) == room_link.followed_part(state)
    for change in (
        {"step": 4},
        {"view": "flow"},
        {"temperature": 0.5},
        {"chapter": 2},
        {"prompt": "x"},
        {"layer": 1},
        {"policy": "radix"},
    ):
        assert room_link.followed_part(replace(state, **change)) != room_link.followed_part(state), change


class FakeSession:
    """What `ui.host.streamlit_internals` asks of a Streamlit session: the fragments it holds, its last client state,
    a rerun."""

    def __init__(self, held: set[str]):
        from streamlit.proto.ClientState_pb2 import ClientState

        self._client_state = ClientState(query_string="follow=abc&step=3", fragment_id="poll")
        self.held, self.asked = held, []

    def has_fragment(self, fragment_id: str) -> bool:
        return fragment_id in self.held

    def request_rerun(self, state) -> None:
        self.asked.append(state)


def test_a_leaders_move_runs_a_followers_step_fragment_alone_while_the_session_holds_it():
    """A follower whose step fragment is known runs that fragment alone; one whose fragment is gone (a run of the
    whole page made a new one) or unknown runs its whole page. Each with the session's own link."""
    from ui.host import streamlit_internals

    session = FakeSession(held={"step"})
    for fragment_id in ("step", "gone", None):
        streamlit_internals._run(session, fragment_id)
    assert [state.fragment_id for state in session.asked] == ["step", "", ""]
    assert {state.query_string for state in session.asked} == {"follow=abc&step=3"}
    assert not any(state.is_auto_rerun for state in session.asked)


def test_each_page_draws_in_the_turn_of_its_role(leader, monkeypatch):
    """`ui.runs.turns`: a follower draws the teacher's step in a follower's turn, the teacher's page in the
    leader's, and a student who left to explore in an explorer's."""
    asked, real = [], turns.turn
    monkeypatch.setattr(turns, "turn", lambda role, waiting=None: asked.append(role) or real(role, waiting))
    follower = start(follow=code_in(follow_link(leader)))
    assert asked and set(asked) == {turns.FOLLOWER}  # its first draw follows the teacher
    asked.clear()
    leader.button(key="b_next").click().run()
    assert asked and set(asked) == {turns.LEADER}  # the teacher's own draws
    settle()
    asked.clear()
    follower.run()
    assert step_of(follower) == step_of(leader) and asked and set(asked) == {turns.FOLLOWER}
    follower.button(key="b_follow_leave").click().run()
    asked.clear()
    follower.button(key="b_next").click().run()
    assert step_of(follower) == step_of(leader) + 1 and asked and set(asked) == {turns.EXPLORER}


def test_a_follower_back_by_itself_says_so_through_the_teachers_next_move(leader, monkeypatch):
    """The room gone (a store restarted empty), the follower waits; the teacher's page publishes again and then
    moves at once (its move made during the outage): the follower follows both and says it is back, until
    REJOINED_SECONDS have passed on its clock, when it says it follows as usual."""
    from tests.helpers import Clock
    from ui.follow import follower as follower_side

    clock = Clock()
    monkeypatch.setattr(follower_side, "clock", clock)
    code = code_in(follow_link(leader))
    student = start(follow=code)
    room_link.room_sync().rooms.store.delete(rooms.KEY_PREFIX + code)
    room_link.room_sync().watch(code)  # the next read finds no room
    settle()
    student.run()
    assert [w.value for w in student.warning] == [strings.t("follow_gone")]
    leader.run()  # the teacher's page draws again: its room is published again
    settle()
    student.run()
    assert strings.t("follow_rejoined") in [i.value for i in student.info]
    leader.button(key="b_next").click().run()
    settle()
    clock.now += follower_side.REJOINED_SECONDS - 1
    student.run()
    assert step_of(student) == step_of(leader) == 3
    assert strings.t("follow_rejoined") in [i.value for i in student.info]
    clock.now += 2
    student.run()
    assert banner(student) == "follow_following" and step_of(student) == 3

"""More than one server: scripts/serve_class.py's nginx keeps each browser on one app process by its
`kvscope_server` cookie, every app serves, a killed Redis is started again while every page goes on being served
and the rooms' followers follow again, and stopping the script stops every process it started.

One deployment (redis, two app processes, nginx) for the module, on free loopback ports chosen here, so the
test knows independently which port is which app. nginx's access log (deploy/nginx.conf) records, per request,
the cookie it carried and the address nginx actually connected to. Needs Debian's chromium, nginx and
redis-server (`.ci/run` installs them).
"""

import os
import re
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
from playwright.sync_api import expect

from tests.helpers import WAIT_MS, expected, link, press, until_link
from tests.server import ROOT, Output, free_port, settled_text, wait_until_listening
from tests.test_follow_browser import leader_moves, shows
from tests.test_follow_faults import DOWN, LEAD_DOWN, open_class, pages, timed_next  # noqa: F401 (pages: a fixture)
from ui.text import strings

pytestmark = pytest.mark.browser

COOKIE = "kvscope_server"
PROMPT = "Name three colours."
START_SECONDS = 240  # a harness timeout for the script's start: two app processes import torch at once


@dataclass
class Deployment:
    url: str
    ports: dict[str, int]  # app name → its loopback port, as passed to the script
    redis_port: int
    run_dir: Path
    script: subprocess.Popen
    output: Output  # what the script prints, as it prints it (and in the module's folder, script.txt)

    def started(self) -> dict[str, int]:
        """Each child's pid as the script last said it started it ("started <name> (pid N)"; again after a restart)."""
        printed = "\n".join(self.output.lines)
        return {name: int(pid) for name, pid in re.findall(r"started (\S+) \(pid (\d+)\)", printed)}

    def redis_started_again(self, since: int) -> int:
        """The pid of the redis-server the script says it started again, after saying that the last one exited,
        both in what it printed from line `since` on; once that one takes connections on Redis's port."""
        exited, _ = self.output.wait_for(r"^kvscope: redis exited", since)
        started, found = self.output.wait_for(r"^kvscope: started redis \(pid (\d+)\)", since)
        assert exited < started, self.output.lines[since:]
        pid = int(found.group(1))
        wait_until_listening(self.redis_port, pid)
        return pid

    def served(self) -> list[tuple[str, int]]:
        """(cookie sent, port nginx connected to) for every proxied request so far; the last port if it tried
        more than one."""
        log = (self.run_dir / "access.log").read_text()
        found = re.findall(r"cookie=(\S+) upstream=.*:(\d+)$", log, re.MULTILINE)
        return [(cookie, int(port)) for cookie, port in found]


def alive(pid: int) -> bool:
    """Running (a zombie has already exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (children, their children…), from /proc."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    folder = tmp_path_factory.mktemp("servers")
    ports, redis_port = {"app1": free_port(), "app2": free_port()}, free_port()
    command = [
        sys.executable,
        str(ROOT / "scripts" / "serve_class.py"),
        "--port",
        str(free_port()),
        "--servers",
        "2",
        "--app-ports",
        *map(str, ports.values()),
        "--redis-port",
        str(redis_port),
        "--run-dir",
        str(folder / "run"),
    ]
    script = subprocess.Popen(
        command, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    output = Output(script, folder / "script.txt")
    started = set()
    try:
        _, found = output.wait_for(r"^kvscope: (http://\S+)", seconds=START_SECONDS)  # it serves
        started = descendants(script.pid)  # now, while they are still the script's children
        yield Deployment(found.group(1), ports, redis_port, folder / "run", script, output)
    finally:
        leftovers = started | descendants(script.pid)
        if script.poll() is None:
            script.send_signal(signal.SIGTERM)
            try:
                script.wait(timeout=60)
            except subprocess.TimeoutExpired:
                script.kill()
                script.wait()
        for pid in leftovers:  # only if the script failed to stop them (the last test then fails too)
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def cookie_of(context) -> str:
    return next(c["value"] for c in context.cookies() if c["name"] == COOKIE)


def counter(page) -> str:
    return page.locator(".kv-counter").inner_text()


def redis_answers(port: int) -> bool:
    import redis

    try:
        return redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1).ping()
    except redis.RedisError:
        return False


def assert_every_app_serves(deployment: Deployment) -> None:
    """The page and the health check, through nginx, from each app (its cookie)."""
    for name in deployment.ports:
        for path in ("/", "/_stcore/health"):
            request = urllib.request.Request(deployment.url + path, headers={"Cookie": f"{COOKIE}={name}"})
            with urllib.request.urlopen(request, timeout=30) as response:
                assert response.status == 200, (name, path)
    assert_each_request_reached_its_cookie(deployment)


def assert_each_request_reached_its_cookie(deployment: Deployment) -> None:
    for cookie, port in deployment.served():
        if cookie in deployment.ports:  # "-": the first request of a browser, before it had a cookie
            assert port == deployment.ports[cookie], (cookie, port)


def test_a_page_keeps_its_server_across_steps(deployment, browser, embedded_model):
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    try:
        page = context.new_page()
        page.goto(f"{deployment.url}/?prompt={quote(PROMPT)}")
        settled_text(page)
        first = cookie_of(context)
        assert first in deployment.ports
        press(page, "b_next")
        until_link(page, step="1")
        press(page, "b_next")
        until_link(page, step="2")
        page.locator("h1").first.click()  # focus the page, not a field: → is the Next key
        page.keyboard.press("ArrowRight")
        text = until_link(page, step="3")
        assert text == expected(embedded_model, PROMPT, 3)
        assert counter(page).startswith(strings.t("counter_decode", step=3, position=0).rsplit(" ", 1)[0])
        assert link(page)["step"] == "3"
        assert cookie_of(context) == first
        assert_each_request_reached_its_cookie(deployment)
        ports = {port for cookie, port in deployment.served() if cookie == first}
        assert ports == {deployment.ports[first]}
    finally:
        context.close()


def test_two_browsers_on_different_servers_both_work(deployment, browser, embedded_model):
    contexts, before = [], len(deployment.served())
    try:
        pages = {}
        for name in deployment.ports:  # force each browser's server by its cookie
            context = browser.new_context(viewport={"width": 1280, "height": 720})
            contexts.append(context)
            context.add_cookies([{"name": COOKIE, "value": name, "url": deployment.url}])
            pages[name] = context.new_page()
            pages[name].goto(f"{deployment.url}/?prompt={quote(PROMPT)}&step=1")
        for name, page in pages.items():
            assert settled_text(page) == expected(embedded_model, PROMPT, 1), name
            press(page, "b_next")
        for (name, page), context in zip(pages.items(), contexts):
            assert until_link(page, step="2") == expected(embedded_model, PROMPT, 2), name
            assert cookie_of(context) == name
        assert_each_request_reached_its_cookie(deployment)
        reached = {port for cookie, port in deployment.served()[before:] if cookie != "-"}
        assert reached == set(deployment.ports.values())  # each app served its own browser
    finally:
        for context in contexts:
            context.close()


def test_a_follower_on_the_other_server_follows_its_leader_through_the_shared_store(deployment, browser):
    """The leader's room lives in Redis: a student whose browser lands on the other app process still follows."""
    leader_server, follower_server = list(deployment.ports)[:2]
    contexts = []
    try:
        pages = []
        for name in (leader_server, follower_server):
            context = browser.new_context(viewport={"width": 1280, "height": 720})
            context.add_cookies([{"name": COOKIE, "value": name, "url": deployment.url}])
            contexts.append(context)
            pages.append(context.new_page())
        leader, follower = pages
        leader.goto(f"{deployment.url}/?lead=1&prompt={quote(PROMPT)}")
        settled_text(leader)
        href = leader.locator(".st-key-follow-link a").get_attribute("href")
        follower.goto(deployment.url + "/?" + href.split("?", 1)[1])  # the students' link, through the proxy
        settled_text(follower)
        expect(follower.get_by_text(strings.t("follow_following"))).to_be_visible()
        for step in ("1", "2"):
            now = leader_moves(leader, "b_next", step=step)
            shows(follower, now)
        assert (cookie_of(contexts[0]), cookie_of(contexts[1])) == (leader_server, follower_server)
        assert_each_request_reached_its_cookie(deployment)
    finally:
        for context in contexts:
            context.close()


def test_an_unknown_cookie_is_drawn_again(deployment):
    """A cookie from a larger deployment (app9) names no server here: nginx draws one and says so."""
    request = urllib.request.Request(deployment.url + "/_stcore/health", headers={"Cookie": f"{COOKIE}=app9"})
    with urllib.request.urlopen(request, timeout=30) as response:
        given = re.search(rf"{COOKIE}=(\w+)", " ".join(response.headers.get_all("Set-Cookie") or []))
        assert response.status == 200
    assert given and given.group(1) in deployment.ports


def test_a_killed_redis_is_started_again_on_its_port_and_every_app_goes_on_serving(deployment):
    """kill -9 the script's redis-server: the script stays up and says so, a new one answers on the same port, and
    nginx and both apps (not restarted) serve the page and its health check."""
    before, since = deployment.started(), len(deployment.output.lines)
    os.kill(before["redis"], signal.SIGKILL)
    again = deployment.redis_started_again(since)
    assert again != before["redis"] and redis_answers(deployment.redis_port)  # a new one, on the same port
    assert deployment.script.poll() is None
    now = deployment.started()
    assert now["redis"] == again
    assert not alive(before["redis"]) and alive(now["redis"])
    assert {name: pid for name, pid in now.items() if name != "redis"} == {
        name: pid for name, pid in before.items() if name != "redis"
    }
    assert all(alive(pid) for pid in now.values())
    assert_every_app_serves(deployment)


def test_followers_on_both_servers_are_back_in_step_after_a_killed_redis_returns(deployment, pages):  # noqa: F811
    """The teacher (on app1) moves while Redis is down: the script is held (SIGSTOP) so that it starts no Redis
    until the move is made, as a Redis that takes a while to come back. The new Redis is empty; the teacher's page
    publishes its room again and both followers, one beside the teacher (app1) and one that reads the room through
    Redis alone (app2), show the teacher's step and say they follow again, by themselves (how soon:
    bench/store_faults.py measures a return on one server)."""
    leader, beside, across = pages
    first, other = list(deployment.ports)[:2]
    for page, name in zip(pages, (first, first, other)):
        page.context.add_cookies([{"name": COOKIE, "value": name, "url": deployment.url}])
    open_class(deployment.url, leader, [beside, across])
    since = len(deployment.output.lines)
    os.kill(deployment.script.pid, signal.SIGSTOP)
    try:
        os.kill(deployment.started()["redis"], signal.SIGKILL)
        for page, says in ((beside, DOWN), (across, DOWN), (leader, LEAD_DOWN)):
            expect(page.get_by_text(says)).to_be_visible(timeout=WAIT_MS)  # each page saw the store go
        _, now = timed_next(leader, 2)  # held by the teacher's page alone: Redis never had it
        assert_every_app_serves(deployment)
    finally:
        os.kill(deployment.script.pid, signal.SIGCONT)
    deployment.redis_started_again(since)
    for follower in (beside, across):
        shows(follower, now)
        expect(follower.get_by_text(strings.t("follow_rejoined"))).to_be_visible(timeout=WAIT_MS)
    expect(leader.get_by_text(LEAD_DOWN)).to_have_count(0, timeout=WAIT_MS)  # the teacher is told it is back
    _, now = timed_next(leader, 3)  # and the room goes on in the new Redis
    for follower in (beside, across):
        shows(follower, now)


def test_stopping_the_script_stops_everything_it_started(deployment):
    """Last in the module: TERM, as Ctrl-C or a service manager sends."""
    started = set(deployment.started().values())
    below = descendants(deployment.script.pid)
    assert len(started) == 4 and started <= below  # redis, two apps, nginx; nginx's worker is below its master
    deployment.script.send_signal(signal.SIGTERM)
    assert deployment.script.wait(timeout=90) == 0
    assert [pid for pid in below if alive(pid)] == []
    with pytest.raises(OSError):
        urllib.request.urlopen(deployment.url + "/_stcore/health", timeout=5)

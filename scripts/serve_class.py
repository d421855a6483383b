"""kvscope for a class on one machine: N identical app processes behind nginx, each browser kept on one of them.

    HF_HUB_OFFLINE=1 python scripts/serve_class.py                         # http://127.0.0.1:8080, 2 servers
    HF_HUB_OFFLINE=1 python scripts/serve_class.py --port 80 --servers 4 --address 0.0.0.0

Starts, as the caller's own processes on loopback: a `redis-server` (no persistence) that the app processes
share for the teacher's follow rooms (`KVSCOPE_STORE`), N `streamlit run serve.py`, and nginx from
deploy/nginx.conf (cookie-sticky; its files in a run folder). Prints `kvscope: <url>` once every app answers
its health check and nginx answers. Then it keeps the class served:

- an app process that exits is started again on its port (its pages reconnect and rebuild from their link);
  one that exits again within CRASH_LOOP_SECONDS of that stops the script (it cannot start);
- a redis-server that exits is started again on its port, the apps and nginx left as they are: pages keep
  working, and only following the teacher pauses. The new Redis is empty, but each teacher's page publishes
  its room again within a second (its heartbeat) and the followers follow again by themselves (ui/follow/).
  One that exits again within CRASH_LOOP_SECONDS is started after 1 s, then 2, 4… up to REDIS_WAIT_MAX;
- nginx exiting stops the script and everything it started: no page could be served.

Ctrl-C or TERM stops everything. Needs Debian's `nginx` and `redis-server` packages (see .ci/run).
"""

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "deploy" / "nginx.conf"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"  # Debian installs it outside a user's PATH
REDIS = shutil.which("redis-server") or "/usr/bin/redis-server"
START_SECONDS = 180  # an app imports torch and transformers before it answers (longer on a busy machine)
CRASH_LOOP_SECONDS = 30  # an app started again that exits this soon cannot start: stop rather than loop
# Redis holds only the rooms, which the teachers' pages publish again: the script waits for one that keeps failing
# (its port taken, its folder gone) rather than give up on the whole class, 1 s then twice as long each time.
REDIS_WAIT_FIRST, REDIS_WAIT_MAX = 1.0, 30.0


@dataclass
class Child:
    """One process this script started: its name (app1, redis, nginx), the command and its log."""

    name: str
    command: list[str]
    log: Path
    env: dict[str, str]
    process: subprocess.Popen | None = None
    started_at: float = 0.0

    def start(self) -> None:
        self.started_at = time.time()
        with open(self.log, "a") as log:
            # Its own process group: a Ctrl-C in the terminal reaches this script only, which stops the
            # children in order (nginx first, so no request reaches a stopping app).
            self.process = subprocess.Popen(
                self.command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if not self.running():
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def app_names(count: int) -> list[str]:
    return [f"app{i}" for i in range(1, count + 1)]


def nginx_config(run_dir: Path, listen: str, app_ports: list[int]) -> str:
    """deploy/nginx.conf with its placeholders filled for apps app1..appN on `app_ports` (loopback)."""
    names = app_names(len(app_ports))
    upstreams = []
    for i, (name, port) in enumerate(zip(names, app_ports)):
        backup = app_ports[(i + 1) % len(app_ports)]
        servers = f"server 127.0.0.1:{port} max_fails=1 fail_timeout=5s;"
        if backup != port:
            servers += f" server 127.0.0.1:{backup} backup;"
        upstreams.append(f"upstream {name} {{ {servers} }}")
    share = int(10_000 / len(names)) / 100  # nginx reads two decimals; rounded down, they stay within 100%
    split = [f"{share:.2f}% {name};" for name in names[:-1]] + [f"* {names[-1]};"]
    filled = {
        "RUN_DIR": str(run_dir),
        "LISTEN": listen,
        "UPSTREAMS": "\n    ".join(upstreams),
        "SPLIT": " ".join(split),
        "KNOWN": " ".join(f"{name} {name};" for name in names),
        "SERVED": " ".join(f"~:{port}$ {name};" for name, port in zip(names, app_ports)),
    }
    text = TEMPLATE.read_text()
    for key, value in filled.items():
        text = text.replace(f"@{key}@", value)
    return text


def app_child(name: str, port: int, store: str, run_dir: Path) -> Child:
    command = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(ROOT / "serve.py"),
        "--server.port",
        str(port),
        "--server.address",
        "127.0.0.1",
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
    ]
    return Child(name, command, run_dir / f"{name}.log", {**os.environ, "KVSCOPE_STORE": store})


def redis_child(port: int, run_dir: Path) -> Child:
    command = [
        REDIS,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(run_dir),
    ]
    return Child("redis", command, run_dir / "redis.log", dict(os.environ))


def nginx_child(run_dir: Path) -> Child:
    config = run_dir / "nginx.conf"
    command = [NGINX, "-p", str(run_dir), "-c", str(config), "-e", str(run_dir / "error.log"), "-g", "daemon off;"]
    return Child("nginx", command, run_dir / "nginx.log", dict(os.environ))


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def redis_answers(port: int) -> bool:
    """A PING on the Redis protocol answered with PONG."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def wait_for(what: str, ready, children: list[Child], seconds: float = START_SECONDS) -> None:
    """Poll `ready()` until true; fail if `seconds` pass or a child exits first (its log says why)."""
    deadline = time.time() + seconds
    while not ready():
        for child in children:
            if not child.running():
                raise RuntimeError(f"{child.name} exited while waiting for {what}; see {child.log}")
        if time.time() > deadline:
            raise RuntimeError(f"{what} did not answer within {seconds:.0f} s")
        time.sleep(0.5)


class Stopped(Exception):
    """Ctrl-C or TERM."""


def on_signal(signum, frame) -> None:
    raise Stopped(signal.Signals(signum).name)


def start(child: Child) -> None:
    child.start()
    print(f"kvscope: started {child.name} (pid {child.process.pid})", flush=True)


def supervise(apps: list[Child], redis: Child, nginx: Child, redis_port: int) -> None:
    """Run until a signal: start again an app or redis that exits; stop if nginx exits (nothing could serve)."""
    restarted: list[Child] = []
    redis_wait = 0.0  # before starting redis again: none after it ran a while, growing while it keeps exiting
    redis_due: float | None = None  # when redis, found exited, is started again
    while True:
        time.sleep(1)
        if not nginx.running():
            raise RuntimeError(f"nginx exited (code {nginx.process.returncode}); see {nginx.log}")
        if not redis.running() and redis_due is None:
            # The apps keep serving meanwhile: their room thread retries the store on its own (ui/follow/sync.py).
            soon = time.time() - redis.started_at < CRASH_LOOP_SECONDS
            redis_wait = min(max(REDIS_WAIT_FIRST, 2 * redis_wait), REDIS_WAIT_MAX) if soon else 0.0
            redis_due = time.time() + redis_wait
            when = f"in {redis_wait:.0f} s" if redis_wait else "now"
            print(
                f"kvscope: redis exited (code {redis.process.returncode}; see {redis.log}); starting it again "
                f"on port {redis_port} {when}, empty (the teachers' pages publish their rooms again)",
                flush=True,
            )
        if redis_due is not None and time.time() >= redis_due:
            redis_due = None
            start(redis)
        for app in apps:
            if not app.running():
                if app in restarted and time.time() - app.started_at < CRASH_LOOP_SECONDS:
                    raise RuntimeError(
                        f"{app.name} exited again within {CRASH_LOOP_SECONDS} s of its restart; see {app.log}"
                    )
                restarted.append(app)
                print(f"kvscope: {app.name} exited (code {app.process.returncode}); starting it again", flush=True)
                start(app)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8080, help="public port (nginx); default 8080")
    parser.add_argument("--servers", type=int, default=2, help="number of app processes; default 2")
    parser.add_argument(
        "--address",
        default="127.0.0.1",
        help="address nginx listens on; 0.0.0.0 for students on the network (default loopback)",
    )
    parser.add_argument(
        "--app-ports", type=int, nargs="*", help="ports of the app processes (default: free loopback ports)"
    )
    parser.add_argument("--redis-port", type=int, help="port of redis-server (default: a free loopback port)")
    parser.add_argument("--run-dir", type=Path, help="folder for logs and nginx's files (default: a new temp folder)")
    args = parser.parse_args(argv)
    if args.servers < 1:
        parser.error("--servers must be at least 1")
    if args.app_ports and len(args.app_ports) != args.servers:
        parser.error(f"--app-ports needs {args.servers} ports, one per server")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run_dir = (args.run_dir or Path(tempfile.mkdtemp(prefix="kvscope-serve-"))).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    run_dir.chmod(0o755)  # nginx run by root hands its workers to `nobody`, who must reach the temp folders
    app_ports = args.app_ports or [free_port() for _ in range(args.servers)]
    redis_port = args.redis_port or free_port()
    store = f"redis://127.0.0.1:{redis_port}/0"
    (run_dir / "nginx.conf").write_text(nginx_config(run_dir, f"{args.address}:{args.port}", app_ports))

    redis = redis_child(redis_port, run_dir)
    apps = [app_child(name, port, store, run_dir) for name, port in zip(app_names(args.servers), app_ports)]
    nginx = nginx_child(run_dir)
    children = [redis, *apps, nginx]
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        for child in children:
            start(child)
        wait_for("redis", lambda: redis_answers(redis_port), children)
        for app, port in zip(apps, app_ports):
            wait_for(app.name, lambda port=port: answers(f"http://127.0.0.1:{port}/_stcore/health"), children)
        host = "127.0.0.1" if args.address in ("0.0.0.0", "::") else args.address
        url = f"http://{host}:{args.port}"
        wait_for("nginx", lambda: answers(url + "/_stcore/health"), children)
        print(f"kvscope: {url}  (app servers: {args.servers}; logs in {run_dir}; Ctrl-C stops)", flush=True)
        if host != args.address:
            print(f"kvscope: students open this machine's address, port {args.port}", flush=True)
        supervise(apps, redis, nginx, redis_port)
    except Stopped as signal_name:
        print(f"kvscope: {signal_name}; stopping", flush=True)
        return 0
    except RuntimeError as problem:
        print(f"kvscope: {problem}", file=sys.stderr, flush=True)
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave children behind
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for child in reversed(children):  # nginx first, redis last
            child.stop()
        print("kvscope: stopped", flush=True)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())

"""A real Redis server on loopback for the tests of rooms shared between app servers (ui/follow/store.py)."""

import contextlib
import os
import shutil
import signal
import subprocess
from pathlib import Path

from tests.server import Output, free_port, stop

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"  # Debian's package; .ci/run installs it


@contextlib.contextmanager
def running_redis(folder: Path):
    """Start redis-server (no snapshots, no append-only file) on a free loopback port; yield its redis:// URL."""
    with redis_process(folder) as (url, _):
        yield url


@contextlib.contextmanager
def redis_process(folder: Path, port: int | None = None):
    """As `running_redis`, on `port` if given (a restart on the same address); yield (url, process), the process
    for tests that pause (SIGSTOP) or stop it."""
    import redis

    port = port or free_port()
    log = folder / f"redis-{port}.log"
    process = subprocess.Popen(
        [
            REDIS_SERVER,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(folder),
        ],  # it logs to stdout: `Output`
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        try:
            Output(process, log).wait_for("Ready to accept connections", seconds=60)  # 60: a harness timeout
        except RuntimeError as error:
            raise RuntimeError(f"redis-server did not start ({error}); see {log}") from None
        client = redis.Redis.from_url(url)
        assert client.ping()
        client.close()
        yield url, process
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGCONT)  # a paused server cannot act on SIGTERM
        stop(process)

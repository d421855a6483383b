"""A real Redis server on loopback for the tests of rooms shared between app servers (ui/follow/store.py)."""

import contextlib
import os
import signal
import shutil
import subprocess
import time
from pathlib import Path

from tests.server import free_port, stop

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
    process = subprocess.Popen([REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                "--appendonly", "no", "--dir", str(folder), "--logfile", str(log)])
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url)
        deadline = time.time() + 20
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.time() > deadline or process.poll() is not None:
                    raise RuntimeError("redis-server did not start; see " + str(log)) from None
                time.sleep(0.1)
        client.close()
        yield url, process
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGCONT)  # a paused server cannot act on SIGTERM
        stop(process)

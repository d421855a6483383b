"""deploy/nginx.conf as scripts/serve_class.py fills it: nginx itself accepts it for any number of servers (its
split shares within 100%, every placeholder filled). The running deployment: tests/test_servers.py."""

import importlib.util
import re
import subprocess

import pytest

from tests.server import ROOT

spec = importlib.util.spec_from_file_location("serve_class", ROOT / "scripts" / "serve_class.py")
serve_class = importlib.util.module_from_spec(spec)
spec.loader.exec_module(serve_class)


@pytest.mark.parametrize("servers", [1, 2, 3, 7])
def test_nginx_accepts_the_filled_template(servers, tmp_path):
    ports = list(range(18601, 18601 + servers))
    config = tmp_path / "nginx.conf"
    config.write_text(serve_class.nginx_config(tmp_path, "127.0.0.1:18080", ports))
    assert not re.search(r"@[A-Z_]+@", config.read_text())
    checked = subprocess.run(
        [serve_class.NGINX, "-t", "-p", str(tmp_path), "-c", str(config), "-e", str(tmp_path / "error.log")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stderr

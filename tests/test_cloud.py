"""Streamlit Community Cloud in both languages: what `cloud/requirements.txt` lists, installed into a fresh venv,
serves a page in Chinese on `embedded-zh` from the Cloud entry point (`cloud/streamlit_app.py`), offline.

The venv sees none of this machine's packages (no --system-site-packages), so a package the file leaves out is
missing there as it would be on Community Cloud. Only PyTorch is installed otherwise: the file's CPU-wheel line
and its extra index are left out (that index may be out of reach), and the root requirements' own `torch==` pin,
which the file includes, installs PyTorch from pip's usual sources instead.

The server reads Gemma's converted weights from the cache every other test uses (`KVSCOPE_CACHE`, else
~/.cache/kvscope): the fixture converts them first only if no test on this machine has yet, so the page's wait is
a load, not a conversion. Under a minute alone on a 2-core machine, about half of it the install.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine import embedded
from engine.loader import EMBEDDED_DTYPES
from tests.helpers import WAIT_MS
from tests.server import ROOT, free_port, settled_text, stop, wait_until_healthy
from ui.state.link import DEFAULT_PROMPTS
from ui.text import strings

CLOUD = ROOT / "cloud"
REQUIREMENTS = CLOUD / "requirements.txt"
ENTRY = CLOUD / "streamlit_app.py"
INSTALL_SECONDS = 420  # pip into a fresh venv: under half a minute from local wheels, more from a registry
STEP = 2  # the link's step: two tokens of the model's answer on screen


def lines(path: Path) -> list[str]:
    """The file's requirement and option lines, comments and blank lines dropped."""
    kept = (line.split(" #", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in kept if line and not line.startswith("#")]


def without_cpu_wheel(path: Path) -> list[str]:
    """`path`'s lines less its PyTorch CPU wheel and that wheel's index, with an included file's path made
    absolute (the copy is read from elsewhere)."""
    kept = []
    for line in lines(path):
        if line.startswith(("--extra-index-url", "--index-url")) or re.match(r"torch\s*==", line):
            continue
        if line.startswith("-r "):
            line = "-r " + str((path.parent / line[3:].strip()).resolve())
        kept.append(line)
    return kept


def pinned(path: Path) -> dict[str, str]:
    """name → version of each `name==version` line of `path` and the files it includes."""
    found = {}
    for line in lines(path):
        if line.startswith("-r "):
            found.update(pinned(path.parent / line[3:].strip()))
        elif match := re.fullmatch(r"([A-Za-z0-9._-]+)\s*==\s*(\S+)", line):
            found[match[1].lower()] = match[2]
    return found


def test_the_cloud_requirements_pin_the_packages_the_chinese_model_reads():
    """Quick: the five Gemma packages at the version the engine's install hint names (engine/embedded.py)."""
    hint = dict(re.findall(r"(\S+)==(\S+)", embedded.ZH_INSTALL_HINT))
    assert set(hint) == set(embedded.ZH_PACKAGES)
    listed = pinned(REQUIREMENTS)
    assert {name: listed.get(name) for name in hint} == hint


@pytest.fixture(scope="module")
def cloud_venv(tmp_path_factory):
    """A fresh venv holding what cloud/requirements.txt lists (less the CPU wheel): its bin folder."""
    folder = tmp_path_factory.mktemp("cloud")
    requirements = folder / "requirements.txt"
    requirements.write_text("\n".join(without_cpu_wheel(REQUIREMENTS)) + "\n")
    venv = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # --no-compile: the server compiles only what it imports (about half the install's time)
    install = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-compile",
            "--disable-pip-version-check",
            "-r",
            str(requirements),
        ],
        capture_output=True,
        text=True,
        timeout=INSTALL_SECONDS,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    yield venv / "bin"
    shutil.rmtree(venv, ignore_errors=True)  # about 2 GB; pytest keeps its last three sessions' folders


@pytest.fixture(scope="module")
def cloud_server(cloud_venv, tmp_path_factory):
    """`streamlit run cloud/streamlit_app.py` with the venv's Streamlit, from the repository root as Community
    Cloud runs it, offline: its URL."""
    embedded.zh_source(EMBEDDED_DTYPES[embedded.ZH])  # the folder the server will read, verified or converted
    log_path = tmp_path_factory.mktemp("cloud-server") / "log.txt"
    environment = {name: value for name, value in os.environ.items() if name not in ("PYTHONPATH", "PYTHONHOME")}
    environment.update(
        HF_HUB_OFFLINE="1",
        PYTHONNOUSERSITE="1",
        VIRTUAL_ENV=str(cloud_venv.parent),
        PATH=f"{cloud_venv}{os.pathsep}{environment.get('PATH', '')}",
    )
    port = free_port()
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [
                str(cloud_venv / "streamlit"),
                "run",
                str(ENTRY),
                "--server.port",
                str(port),
                "--server.address",
                "127.0.0.1",
                "--server.headless",
                "true",
                "--browser.gatherUsageStats",
                "false",
            ],
            cwd=ROOT,
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        yield wait_until_healthy(port, process, log_path)
    finally:
        stop(process)


@pytest.mark.browser
def test_a_page_in_chinese_runs_gemma_from_the_cloud_entry_point(cloud_server, page):
    """The page opens on Gemma 3 270M with its Chinese prompt and shows the model's first tokens after it."""
    page.goto(f"{cloud_server}/?lang=zh&step={STEP}")
    failed = page.get_by_text(strings.t("model_failed", "zh", model=strings.Shown(embedded.ZH), error=""))
    failed.or_(page.locator(".st-key-generated code")).first.wait_for(timeout=WAIT_MS)  # whichever comes first
    assert failed.count() == 0, failed.first.inner_text()
    text = settled_text(page)
    prompt = "<bos>" + DEFAULT_PROMPTS["zh"]
    assert text.startswith(prompt) and len(text) > len(prompt), text
    page.get_by_text(strings.t("card_title", "zh")).click()  # the model card, collapsed at the page's foot
    page.get_by_text(f"{embedded.ZH_HUB_ID} ({embedded.ZH})", exact=False).first.wait_for(timeout=WAIT_MS)

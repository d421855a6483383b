"""The host's settings table (docs/hosting.md, "Settings") says what the code does: every KVSCOPE_ variable the app
reads is in it, each default it gives is the code's own, and it is the one place the defaults are written."""

import re
from dataclasses import fields
from pathlib import Path

from ui.host.limits import Limits, load_limits

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "docs" / "hosting.md"
ROW = re.compile(r"^\| `(KVSCOPE_[A-Z_0-9]+)` \| ([^|]+) \|", re.MULTILINE)


def rows(path: Path) -> dict[str, str]:
    return {name: default.strip() for name, default in ROW.findall(path.read_text(encoding="utf-8"))}


def table_defaults() -> dict[str, str]:
    return rows(TABLE)


def written(value) -> str:
    """A default as the table writes it: switches as 0/1, numbers as they are."""
    if isinstance(value, bool):
        return str(int(value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def test_every_variable_the_app_reads_is_in_the_table():
    sources = [p for folder in ("ui", "engine", "viz") for p in (ROOT / folder).rglob("*.py")]
    read = {name for p in sources for name in re.findall(r"KVSCOPE_[A-Z_0-9]+", p.read_text(encoding="utf-8"))}
    assert read and read <= set(table_defaults()), read - set(table_defaults())


def test_the_tables_defaults_are_the_limits_defaults():
    table, limits = table_defaults(), load_limits({})
    checked = 0
    for field in fields(Limits):
        name = "KVSCOPE_" + field.name.upper()
        if name in table and name != "KVSCOPE_MODELS":  # that variable adds models to the embedded ones: "(none)"
            assert table[name] == written(getattr(limits, field.name)), name
            checked += 1
    assert checked >= 10  # the numbers and switches, not only a few


def test_the_defaults_read_outside_limits(monkeypatch):
    """The variables read outside `Limits`: the follower's poll, the leader's heartbeat, where converted models
    live, the room store."""
    table = table_defaults()
    source = (ROOT / "ui" / "follow" / "follower.py").read_text(encoding="utf-8")
    poll = re.search(r'POLL_SECONDS = env_seconds\(os\.environ, "KVSCOPE_FOLLOW_POLL_S", ([0-9.]+),', source)
    assert poll, "ui/follow/follower.py no longer reads KVSCOPE_FOLLOW_POLL_S as this test expects"
    assert table["KVSCOPE_FOLLOW_POLL_S"] == written(float(poll.group(1)))
    source = (ROOT / "ui" / "follow" / "leader.py").read_text(encoding="utf-8")
    lead = re.search(r'LEAD_SECONDS = env_seconds\(os\.environ, "KVSCOPE_LEAD_S", ([0-9.]+),', source)
    assert lead, "ui/follow/leader.py no longer reads KVSCOPE_LEAD_S as this test expects"
    assert table["KVSCOPE_LEAD_S"] == written(float(lead.group(1)))

    from engine import embedded

    monkeypatch.delenv("KVSCOPE_CACHE", raising=False)
    monkeypatch.setenv("HOME", "/home/someone")
    assert table["KVSCOPE_CACHE"] == "`~/.cache/kvscope`"
    assert embedded.cache_root() == Path("/home/someone/.cache/kvscope")

    from ui.follow import store

    assert table["KVSCOPE_STORE"] == "(none)"
    assert store.STORE_ENV == "KVSCOPE_STORE"


def test_the_defaults_are_written_once():
    """README and the other docs pages link to the table rather than repeat it."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    holding = [p.relative_to(ROOT).as_posix() for p in pages if rows(p)]
    assert holding == ["docs/hosting.md"], holding

"""README's table of the host's settings says what the code does: every KVSCOPE_ variable the app reads is in it,
and each default it gives for a limit is `Limits`' own."""

import re
from dataclasses import fields
from pathlib import Path

from ui.settings import Limits, load_limits

ROOT = Path(__file__).resolve().parent.parent
ROW = re.compile(r"^\| `(KVSCOPE_[A-Z_0-9]+)` \| ([^|]+) \|", re.MULTILINE)


def readme_defaults() -> dict[str, str]:
    return {name: default.strip() for name, default in ROW.findall((ROOT / "README.md").read_text(encoding="utf-8"))}


def written(value) -> str:
    """A default as the table writes it: switches as 0/1, numbers as they are."""
    if isinstance(value, bool):
        return str(int(value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def test_every_variable_the_app_reads_is_in_the_table():
    sources = [p for folder in ("ui", "engine", "viz") for p in (ROOT / folder).rglob("*.py")]
    read = {name for p in sources for name in re.findall(r"KVSCOPE_[A-Z_0-9]+", p.read_text(encoding="utf-8"))}
    assert read and read <= set(readme_defaults()), read - set(readme_defaults())


def test_the_tables_defaults_are_the_limits_defaults():
    table, limits = readme_defaults(), load_limits({})
    checked = 0
    for field in fields(Limits):
        name = "KVSCOPE_" + field.name.upper()
        if name in table and name != "KVSCOPE_MODELS":  # that variable adds models to `embedded`: "(none)"
            assert table[name] == written(getattr(limits, field.name)), name
            checked += 1
    assert checked >= 10  # the numbers and switches, not only a few

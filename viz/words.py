"""The words `viz` draws into figures and tables. Every viz function takes a `words` mapping with the keys
of `figure_words.csv` (one row a word: its key, English, Chinese), so a page in another language passes its
own; English is the default. Some entries are format strings, filled by the function that uses them.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from pathlib import Path

Words = Mapping[str, str]


def _read_table() -> dict[str, dict[str, str]]:
    """{language: {key: text}} from the CSV next to this file."""
    with open(Path(__file__).with_name("figure_words.csv"), encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    return {lang: {row["key"]: row[lang] for row in rows} for lang in ("en", "zh")}


TRANSLATIONS = _read_table()
ENGLISH: dict[str, str] = TRANSLATIONS["en"]

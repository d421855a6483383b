"""The page's languages and its one translation format: a CSV table, one row a text, its key then one column per
language (`key,en,zh`). `read_words` reads one; the UI's strings (`ui/text/strings.csv`) and the words viz draws into
figures and tables (`figure_words.csv`, next to this file) are two such tables. (`ui/lesson/lesson.toml`, the teacher's
text, keeps its own form.)

Every viz function takes a `words` mapping with the keys of `figure_words.csv`, so a page in another language
passes its own; English is the default. Some entries are format strings, filled by the function that uses them.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from pathlib import Path

LANGUAGES = ("en", "zh")  # the page's languages, each a column of every table, English first (the fallback)
Words = Mapping[str, str]


def read_words(path: Path) -> dict[str, dict[str, str]]:
    """{language: {key: text}} from the table at `path`. An empty cell is a text that language does not have (only
    English's singular variants, `key_one`, may be missing: tests/test_strings.py). A wrong header, a short row or
    a key given twice is refused, naming the line."""
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f))
    if not rows or tuple(rows[0]) != ("key", *LANGUAGES):
        raise ValueError(f"{path}: the first line must be {','.join(('key', *LANGUAGES))}")
    table: dict[str, dict[str, str]] = {lang: {} for lang in LANGUAGES}
    seen: set[str] = set()
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != 1 + len(LANGUAGES) or not row[0] or row[0] in seen:
            raise ValueError(f"{path}, line {line}: a key (once in the table) and one text per language are needed")
        seen.add(row[0])
        for lang, text in zip(LANGUAGES, row[1:]):
            if text:
                table[lang][row[0]] = text
    return table


TRANSLATIONS = read_words(Path(__file__).with_name("figure_words.csv"))
ENGLISH: dict[str, str] = TRANSLATIONS["en"]

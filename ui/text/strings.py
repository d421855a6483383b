"""Every string the UI shows, in every language of `viz.words.LANGUAGES`: `ui/text/strings.csv` (one row a string:
key, English, Chinese), and as "fig_" + their key the words viz draws (`viz/figure_words.csv`, the same format).
`t(key, lang, **values)` formats one, showing every value as text.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from pathlib import Path

from ui.text import safe
from viz.words import LANGUAGES, read_words
from viz.words import TRANSLATIONS as FIGURE_WORDS

STRINGS = read_words(Path(__file__).with_name("strings.csv"))
for _lang in LANGUAGES:
    STRINGS[_lang].update({"fig_" + key: text for key, text in FIGURE_WORDS[_lang].items()})
ENGLISH = STRINGS[LANGUAGES[0]]  # the fallback for a key another language lacks
LANGUAGE_NAMES = {lang: STRINGS[lang]["language_name"] for lang in LANGUAGES}  # each in its own language
SINGULAR = "_one"  # an English-only variant of a counted string, for a count of 1


class Shown(str):
    """Markdown of ours: a string from `t` (our template, every value in it shown as text), or numbers written out
    by our code ("[1.125, -0.144]"). Given to `t` as a value, it is kept as it is."""


def as_text(values: Mapping[str, object]) -> dict[str, object]:
    """`values` for a Markdown template: numbers keep their formats ("{n:,}"), strings from `t` stay as they are,
    anything else (link values, prompts, model names, tokens, errors) is escaped to show as text (`safe.text`)."""
    return {
        name: value if isinstance(value, (Shown, numbers.Number)) else safe.text(value)
        for name, value in values.items()
    }


def t(key: str, lang: str = "en", **values) -> Shown:
    """The string `key` in `lang` (English where that language lacks it), as Markdown with `values` shown as text.
    A string that counts something names its count `n`; where English needs the singular, the key has a variant
    `key + "_one"`, used when n is 1 (Chinese has none)."""
    table = STRINGS.get(lang, ENGLISH)
    if values.get("n") == 1 and key + SINGULAR in table:
        key += SINGULAR
    text = table.get(key, ENGLISH.get(key, key))
    return Shown(text.format(**as_text(values)) if values else text)


def figure_words(lang: str) -> dict[str, str]:
    """The words a viz function draws, in `lang` (English where a translation is missing)."""
    return {key: t("fig_" + key, lang) for key in FIGURE_WORDS[LANGUAGES[0]]}

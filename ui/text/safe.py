"""User and model text inside Streamlit Markdown, shown as text: never a link, image, heading, colour or formula.

Every value from a link, a typed prompt or a model's output goes through `text`: `ui.text.strings.t` passes every
value it formats through it, so a view never has to remember.
"""

from __future__ import annotations

import re

# All ASCII punctuation: CommonMark lets a backslash escape any of it, so `\X` always shows X. That covers
# Markdown ([, !, *, _, `, #, |, ~, <, >), Streamlit's `:red[…]` and `:emoji:` (:), and LaTeX ($).
_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")
# A line break would end the paragraph (a new block could start there); show it as a symbol instead.
_BREAKS = re.compile(r"\r\n|[\r\n\u2028\u2029]")
# Streamlit's Markdown turns web and mail addresses in plain text into links after escapes are read, so an
# invisible word joiner splits what its patterns need: "://", "www." and "@host".
_ADDRESS_PARTS = re.compile(r"(?<=:)(?=/)|(?<=www)(?=\.)|(?<=@)", re.IGNORECASE)


def text(value: object) -> str:
    """`value` as Markdown that Streamlit renders literally, on one line (a newline shows as ↵)."""
    one_line = _BREAKS.sub("↵", str(value))
    return _PUNCTUATION.sub(r"\\\1", _ADDRESS_PARTS.sub("\u2060", one_line))

"""The token stream: prompt and answer as one sequence of token ids, each one hoverable."""

from __future__ import annotations

import html
from itertools import groupby

import pandas as pd

from engine.tokens import TokenCell
from viz.style import GENERATED_COLOR, NEWEST_COLOR, PROMPT_COLOR
from viz.words import ENGLISH, Words


def visible(text: str) -> str:
    """Make whitespace visible in a token chip."""
    return text.replace(" ", "·").replace("\n", "↵").replace("\t", "⇥") or "∅"


SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")
SUBSCRIPT = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")


def part_marker(part: int, parts: int) -> str:
    """ "¹⁄₂": part 1 of 2, as a small fraction that sits on the character and stays one label wide."""
    return str(part).translate(SUPERSCRIPT) + "⁄" + str(parts).translate(SUBSCRIPT)


def reads_as(cell: TokenCell) -> str:
    """What one position reads as: its token's own text, or, for a token that is one of several making up a
    character, that character and which part, e.g. "解¹⁄₂" then "解²⁄₂". A piece of a character not finished
    (the run stopped there) reads as its own bytes, e.g. "⟨e8 a7⟩"."""
    group = cell.group
    if group.size == 1 or not group.whole:
        return cell.text
    return group.text + part_marker(cell.part, group.size)


def position_label(cell: TokenCell) -> str:
    """`reads_as` with whitespace made visible: a position's label in figures and tables."""
    return visible(reads_as(cell))


def splits_characters(cells: list[TokenCell]) -> bool:
    """Whether any token holds only part of a character (grouped with others, or shown as bytes)."""
    return any(c.group.size > 1 or not c.group.whole for c in cells)


INPUT_OUTLINE = "#000000"
STREAM_LINES = {False: 3, True: 2}  # lines of chips shown (large text: fewer); a longer stream scrolls in its box


def token_chip_styles(size: str) -> str:
    """CSS for chips (class kv-chip) of each kind at font size `size`; an input chip is outlined in black.
    Only the stream's own chips also carry kv-token: the legend's and the header's are not tokens of the text."""
    return (
        f".kv-chip{{border-radius:4px;padding:1px 3px;margin:1px;display:inline-block;font-family:monospace;"
        f"font-size:{size}}}"
        f".kv-prompt{{background:{PROMPT_COLOR}33;border:1px solid {PROMPT_COLOR}}}"
        f".kv-generated{{background:{GENERATED_COLOR}33;border:1px solid {GENERATED_COLOR}}}"
        f".kv-newest{{background:{NEWEST_COLOR}55;border:2px solid {NEWEST_COLOR}}}"
        f".kv-chip.kv-input{{outline:3px solid {INPUT_OUTLINE};outline-offset:-1px}}"
        # a character made of several tokens: one chip, with a row of small bars under it, one per token in
        # that token's colour (its own hover says which token it is)
        ".kv-group{display:inline-flex;flex-direction:column;align-items:center;vertical-align:bottom;"
        "line-height:1.25}"
        ".kv-parts{display:flex;gap:2px;margin-top:1px}"
        ".kv-part{display:inline-block;width:0.6em;height:0.25em;border:none !important;border-radius:1px;padding:0;"
        "margin:0}"
        f".kv-part.kv-prompt{{background:{PROMPT_COLOR}}}.kv-part.kv-generated{{background:{GENERATED_COLOR}}}"
        f".kv-part.kv-newest{{background:{NEWEST_COLOR}}}"
        ".kv-part.kv-input{outline:2px solid " + INPUT_OUTLINE + "}"
        ".kv-unfinished{border-style:dashed}"
        # a tap (touch screens have no hover) focuses a chip: its hover text then shows in a bar at the foot of
        # the screen (fixed: the stream's scrolling box does not clip it)
        ".kv-tip:focus{outline:2px dashed #555;outline-offset:1px}"
        ".kv-tip:focus::after{content:attr(title);position:fixed;left:0.5rem;right:0.5rem;bottom:0.5rem;z-index:1000;"
        "background:#222;color:#fff;padding:0.5rem 0.75rem;border-radius:6px;white-space:pre-line;font-size:1rem;"
        "font-family:sans-serif;text-align:left;line-height:1.4}"
    )


def token_legend_html(labels: dict[str, str], note: str = "", explained: str = "") -> str:
    """One line of sample chips saying which colour is which: `labels` maps "prompt", "generated", "input" and
    "newest" to their words (escaped here); `note` follows in grey. With `explained` (plain text), the note is a
    disclosure that opens to that paragraph under the line: an explanation where it is needed that costs the
    projector's first screen no line of its own."""
    kinds = {
        "prompt": "kv-prompt",
        "generated": "kv-generated",
        "input": "kv-generated kv-input",
        "newest": "kv-newest",
    }
    chips = " ".join(
        f'<span class="kv-chip {kinds[kind]}" style="font-family:inherit;font-size:0.8rem">'
        f"{html.escape(labels[kind])}</span>"
        for kind in kinds
    )
    grey = f' <span style="color:#666;font-size:0.8rem">· {html.escape(note)}</span>' if note else ""
    if explained:
        grey = (
            ' <details class="kv-note" style="display:inline;color:#666;font-size:0.8rem">'
            '<summary style="display:inline;cursor:pointer;text-decoration:underline dotted">'
            f'· {html.escape(note)}</summary>'
            f'<div style="margin-bottom:0.3rem">{html.escape(explained)}</div></details>'
        )
    return f'<div class="kv-legend" style="line-height:1.9">{chips}{grey}</div>'


def token_tip(cell: TokenCell, words: Words = ENGLISH) -> str:
    """A token's hover text in `words`' language: its position, what it reads as (the character and which part
    of it, for a token that is part of a character), its id and its bytes in hex. Never the tokenizer's
    byte-level piece ('æĺ¯' for 是): that is an encoding of the bytes, not text anyone reads."""
    return words["tip_token"].format(
        position=cell.position, text=position_label(cell), id=cell.token_id, bytes=cell.bytes_hex
    )


def token_chip_html(cell: TokenCell, inputs: range, words: Words = ENGLISH) -> str:
    """One token that is whole characters on its own (or a stray byte): one chip, one position."""
    kind = f"kv-{cell.kind} kv-input" if cell.position in inputs else f"kv-{cell.kind}"
    return (
        f'<span class="kv-token kv-chip kv-tip {kind}" tabindex="0" '
        f'title="{html.escape(token_tip(cell, words), quote=True)}">'
        f"{html.escape(visible(cell.text))}</span>"
    )


def group_chip_html(cells: list[TokenCell], inputs: range, words: Words = ENGLISH) -> str:
    """Several tokens that make up one character: one chip holding the character (its bytes, while it is not
    finished), coloured as its last token, with one small bar per token underneath, each bar its token's
    colour, outline and hover. The chip's own hover lists every token."""
    group = cells[0].group
    last = cells[-1]
    kind = f"kv-{last.kind}" + (" kv-input" if any(c.position in inputs for c in cells) else "")
    unfinished = "" if group.whole else " kv-unfinished"
    tip = "\n".join(
        [words["tip_group"].format(text=visible(group.text), n=len(cells))] + [token_tip(c, words) for c in cells]
    )
    parts = "".join(
        f'<span class="kv-token kv-part kv-{c.kind}{" kv-input" if c.position in inputs else ""}" '
        f'title="{html.escape(token_tip(c, words), quote=True)}"></span>'
        for c in cells
    )
    tip = html.escape(tip, quote=True).replace("\n", "&#10;")  # as references: one line of HTML
    return (
        f'<span class="kv-chip kv-group kv-tip {kind}{unfinished}" tabindex="0" title="{tip}">'
        f'<span class="kv-char">{html.escape(visible(group.text))}</span>'
        f'<span class="kv-parts">{parts}</span></span>'
    )


def token_stream_html(
    cells: list[TokenCell],
    large: bool = False,
    inputs: range = range(0),
    legend: str = "",
    lines: int | None = None,
    words: Words = ENGLISH,
) -> str:
    """Chips in reading order; hovering one shows its position, what it reads as, its id and bytes (`token_tip`,
    in `words`' language). All text escaped.
    Tokens that together make one character share one chip (`group_chip_html`). The positions in `inputs`
    (what went into this step) are outlined. The box shows `lines` (else `STREAM_LINES`) lines and scrolls;
    column-reverse opens it scrolled to the end, where the newest tokens are. `legend` (HTML, from
    `token_legend_html`) goes above the box."""
    size = "1.05rem" if large else "0.95rem"  # the page's rem is already a quarter larger with large text
    style = (
        f"<style>.kv-stream-box{{max-height:calc({lines or STREAM_LINES[large]} * 2.1 * {size} + 10px);"
        "overflow-y:auto;display:flex;flex-direction:column-reverse;"
        "border:1px solid #ddd;border-radius:6px;padding:0 4px}"
        f".kv-stream{{line-height:2.1}}{token_chip_styles(size)}</style>"
    )
    chips = []
    for _, grouped in groupby(cells, key=lambda c: c.group.start):
        grouped = list(grouped)
        single = len(grouped) == 1 and grouped[0].group.size == 1
        chips.append(token_chip_html(grouped[0], inputs, words) if single else group_chip_html(grouped, inputs, words))
    return f'{style}{legend}<div class="kv-stream-box"><div class="kv-stream">{"".join(chips)}</div></div>'


def token_frame(cells: list[TokenCell]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "position": [c.position for c in cells],
            "id": [c.token_id for c in cells],
            "token": [c.token for c in cells],
            "text": [c.text for c in cells],
            "reads as": [reads_as(c) for c in cells],
            "bytes": [c.bytes_hex for c in cells],
            "kind": [c.kind for c in cells],
        }
    )

"""The token stream: prompt and answer as one sequence of token ids, each one hoverable."""

from __future__ import annotations

import html

import pandas as pd

from engine.tokens import TokenCell
from viz.style import GENERATED_COLOR, NEWEST_COLOR, PROMPT_COLOR


def visible(text: str) -> str:
    """Make whitespace visible in a token chip."""
    return text.replace(" ", "·").replace("\n", "↵").replace("\t", "⇥") or "∅"


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
    )


def token_legend_html(labels: dict[str, str], note: str = "") -> str:
    """One line of sample chips saying which colour is which: `labels` maps "prompt", "generated", "input" and
    "newest" to their words (escaped here); `note` follows in grey."""
    kinds = {"prompt": "kv-prompt", "generated": "kv-generated", "input": "kv-generated kv-input",
             "newest": "kv-newest"}
    chips = " ".join(f'<span class="kv-chip {kinds[kind]}" style="font-family:inherit;font-size:0.8rem">'
                     f"{html.escape(labels[kind])}</span>" for kind in kinds)
    grey = f' <span style="color:#666;font-size:0.8rem">· {html.escape(note)}</span>' if note else ""
    return f'<div class="kv-legend" style="line-height:1.9">{chips}{grey}</div>'


def token_stream_html(cells: list[TokenCell], large: bool = False, inputs: range = range(0), legend: str = "") -> str:
    """Chips in reading order; hovering one shows its position, id, piece and bytes. All text escaped.
    The positions in `inputs` (what went into this step) are outlined. The box shows `STREAM_LINES` lines and
    scrolls; column-reverse opens it scrolled to the end, where the newest tokens are. `legend` (HTML, from
    `token_legend_html`) goes above the box."""
    size = "1.05rem" if large else "0.95rem"  # the page's rem is already a quarter larger with large text
    style = (f"<style>.kv-stream-box{{max-height:calc({STREAM_LINES[large]} * 2.1 * {size});overflow-y:auto;"
             "display:flex;flex-direction:column-reverse;border:1px solid #ddd;border-radius:6px;padding:0 4px}"
             f".kv-stream{{line-height:2.1}}{token_chip_styles(size)}</style>")
    chips = []
    for c in cells:
        tip = f"#{c.position} · id {c.token_id} · {c.token!r} · bytes {c.bytes_hex}"
        kind = f"kv-{c.kind} kv-input" if c.position in inputs else f"kv-{c.kind}"
        chips.append(f'<span class="kv-token kv-chip {kind}" title="{html.escape(tip, quote=True)}">'
                     f"{html.escape(visible(c.text))}</span>")
    return f'{style}{legend}<div class="kv-stream-box"><div class="kv-stream">{"".join(chips)}</div></div>'


def token_frame(cells: list[TokenCell]) -> pd.DataFrame:
    return pd.DataFrame(
        {"position": [c.position for c in cells], "id": [c.token_id for c in cells],
         "token": [c.token for c in cells], "text": [c.text for c in cells],
         "bytes": [c.bytes_hex for c in cells], "kind": [c.kind for c in cells]}
    )

"""The token stream: prompt and answer as one sequence of token ids, each one hoverable."""

from __future__ import annotations

import html
from dataclasses import dataclass

import pandas as pd

from engine.detokenizer import REPLACEMENT, token_bytes
from viz.style import GENERATED_COLOR, NEWEST_COLOR, PROMPT_COLOR


@dataclass(frozen=True)
class TokenCell:
    position: int
    token_id: int
    token: str  # the tokenizer's piece, e.g. "Ġthe"
    text: str  # what it reads as on its own (bytes shown in hex when it is part of a character)
    bytes_hex: str
    kind: str  # "prompt", "generated" or "newest"


def token_cells(tokenizer, prompt_ids: list[int], generated_ids: list[int]) -> list[TokenCell]:
    cells = []
    ids = list(prompt_ids) + list(generated_ids)
    for position, token_id in enumerate(ids):
        raw = token_bytes(tokenizer, token_id)
        text = tokenizer.decode([token_id])
        if REPLACEMENT in text:  # a piece of a multi-byte character: show its bytes instead
            text = "⟨" + raw.hex(" ") + "⟩"
        if position < len(prompt_ids):
            kind = "prompt"
        else:
            kind = "newest" if position == len(ids) - 1 else "generated"
        cells.append(TokenCell(position, token_id, tokenizer.convert_ids_to_tokens(token_id), text, raw.hex(" "), kind))
    return cells


def visible(text: str) -> str:
    """Make whitespace visible in a token chip."""
    return text.replace(" ", "·").replace("\n", "↵").replace("\t", "⇥") or "∅"


def token_stream_html(cells: list[TokenCell], large: bool = False) -> str:
    """Chips in reading order; hovering one shows its position, id, piece and bytes. All text escaped."""
    size = "1.35rem" if large else "0.95rem"
    style = (
        "<style>.kv-stream{line-height:2.1}.kv-token{border-radius:4px;padding:1px 3px;margin:1px;"
        f"display:inline-block;font-family:monospace;font-size:{size}}}"
        f".kv-prompt{{background:{PROMPT_COLOR}33;border:1px solid {PROMPT_COLOR}}}"
        f".kv-generated{{background:{GENERATED_COLOR}33;border:1px solid {GENERATED_COLOR}}}"
        f".kv-newest{{background:{NEWEST_COLOR}55;border:2px solid {NEWEST_COLOR}}}</style>"
    )
    chips = []
    for c in cells:
        tip = f"#{c.position} · id {c.token_id} · {c.token!r} · bytes {c.bytes_hex}"
        chips.append(f'<span class="kv-token kv-{c.kind}" title="{html.escape(tip, quote=True)}">'
                     f"{html.escape(visible(c.text))}</span>")
    return f'{style}<div class="kv-stream">{"".join(chips)}</div>'


def token_frame(cells: list[TokenCell]) -> pd.DataFrame:
    return pd.DataFrame(
        {"position": [c.position for c in cells], "id": [c.token_id for c in cells],
         "token": [c.token for c in cells], "text": [c.text for c in cells],
         "bytes": [c.bytes_hex for c in cells], "kind": [c.kind for c in cells]}
    )

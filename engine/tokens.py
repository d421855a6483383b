"""Token ids as the student sees them: one cell per position, with its id, piece, text and bytes.

Plain data for the views: they never call the tokenizer themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.detokenizer import REPLACEMENT, token_bytes


@dataclass(frozen=True)
class TokenCell:
    position: int
    token_id: int
    token: str  # the tokenizer's piece, e.g. "Ġthe"
    text: str  # what it reads as on its own (bytes shown in hex when it is part of a character)
    bytes_hex: str
    kind: str  # "prompt", "generated" or "newest"


def token_cells(tokenizer, prompt_ids: list[int], generated_ids: list[int]) -> list[TokenCell]:
    """Prompt then answer as one sequence; the last answer token is the "newest"."""
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

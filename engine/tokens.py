"""Token ids as the student sees them: one cell per position, with its id, piece, text and bytes, and the
character group it belongs to.

A byte-level tokenizer can split one character over several tokens (SmolLM2 reads 解 as the bytes e8 a7 then
a3): each such token holds only some of the character's UTF-8 bytes. The groups here join consecutive tokens
until their bytes make whole characters, so a view can draw one chip for 解 while every position keeps its id.
Where a character ends is `engine.characters`' rule, the one the answer text waits by.

Plain data for the views: they never call the tokenizer themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.characters import REPLACEMENT, open_ids, open_tail, token_bytes

BYTE_GAP = "\u202f"  # narrow no-break space between the bytes of `hex_text`


@dataclass(frozen=True)
class CharGroup:
    """Consecutive positions whose tokens' bytes together are whole UTF-8 characters (most groups: one token)."""

    start: int  # position of its first token
    stop: int  # one past the position of its last token
    text: str  # the characters; when not `whole`, the bytes in hex, e.g. "⟨e8 a7⟩"
    state: str  # "whole"; "unfinished": the text stops mid-character; "invalid": bytes that are no UTF-8

    @property
    def whole(self) -> bool:
        return self.state == "whole"

    @property
    def size(self) -> int:
        """Tokens in the group."""
        return self.stop - self.start


@dataclass(frozen=True)
class TokenCell:
    position: int
    token_id: int
    token: str  # the tokenizer's piece, e.g. "Ġthe"
    text: str  # what it reads as on its own (bytes shown in hex when it is part of a character)
    bytes_hex: str
    kind: str  # "prompt", "generated" or "newest"
    group: CharGroup  # the character(s) this token is (part of); shared by the group's cells

    @property
    def part(self) -> int:
        """Which of its group's tokens this is, from 1."""
        return self.position - self.group.start + 1


def hex_text(raw: bytes) -> str:
    """Bytes shown as bytes, e.g. "⟨e8 a7⟩": what a piece of a character reads as (never U+FFFD). The bytes are
    spaced by a narrow no-break space: a chip keeps them on one line, and `viz.tokens.visible` dots only the
    token's own spaces (byte 20)."""
    return "⟨" + BYTE_GAP.join(f"{byte:02x}" for byte in raw) + "⟩"


def _utf8_state(raw: bytes) -> str:
    """ "whole" (decodes) or "invalid" (holds bytes no UTF-8 has), for bytes that do not end mid-character."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return "invalid"
    return "whole"


def char_groups(pieces: list[bytes], start: int = 0) -> list[CharGroup]:
    """Group consecutive token byte strings (`pieces[i]` is position `start + i`) into whole characters.

    A group closes after the first token whose bytes do not end inside a character (`open_tail`). Bytes that
    are no valid UTF-8 and that no later byte can repair close their group at once (shown in hex), so one stray
    byte cannot swallow the text after it. A group still open at the end (the run stopped mid-character) is
    returned "unfinished".
    """
    groups: list[CharGroup] = []
    first, pending = start, b""
    for position, raw in enumerate(pieces, start):
        pending += raw
        if open_tail(pending):
            continue
        state = _utf8_state(pending)
        text = pending.decode("utf-8") if state == "whole" else hex_text(pending)
        groups.append(CharGroup(first, position + 1, text, state))
        first, pending = position + 1, b""
    if pending:
        groups.append(CharGroup(first, start + len(pieces), hex_text(pending), "unfinished"))
    return groups


def token_cells(tokenizer, prompt_ids: list[int], generated_ids: list[int], start: int = 0) -> list[TokenCell]:
    """Prompt then answer as one sequence; the last answer token is the "newest". Positions count from `start`."""
    ids = list(prompt_ids) + list(generated_ids)
    pieces = [token_bytes(tokenizer, token_id) for token_id in ids]
    group_of = {}
    for group in char_groups(pieces, start):
        group_of.update(dict.fromkeys(range(group.start, group.stop), group))
    cells = []
    for index, (token_id, raw) in enumerate(zip(ids, pieces)):
        text = tokenizer.decode([token_id])
        if REPLACEMENT in text:  # a piece of a multi-byte character: show its bytes instead
            text = hex_text(raw)
        if index < len(prompt_ids):
            kind = "prompt"
        else:
            kind = "newest" if index == len(ids) - 1 else "generated"
        position = start + index
        cells.append(
            TokenCell(
                position,
                token_id,
                tokenizer.convert_ids_to_tokens(token_id),
                text,
                raw.hex(" "),
                kind,
                group_of[position],
            )
        )
    return cells


def unfinished_tail(tokenizer, ids: list[int]) -> list[int]:
    """The ids at the end of `ids` that begin a character not yet finished ([] when the text ends whole)."""
    return list(ids[len(ids) - open_ids(tokenizer, ids) :])


def candidate_cells(tokenizer, context_ids: list[int], candidate_ids: list[int]) -> list[TokenCell]:
    """Each candidate next token as the cell it would become after `context_ids`: a candidate that finishes a
    character the context left unfinished gets that character's group (so it reads as 解, not as ⟨a3⟩)."""
    tail = unfinished_tail(tokenizer, context_ids)
    first = len(context_ids) - len(tail)
    return [token_cells(tokenizer, tail, [candidate], start=first)[-1] for candidate in candidate_ids]

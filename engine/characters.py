"""Where characters end in a run of token ids: the one rule for "is this character complete", used by the
answer text (`engine.detokenizer`: a piece waits for the rest of its character) and by the token cells
(`engine.tokens`: one chip per character), so the two cannot disagree.

The rule is on UTF-8 bytes, not on decoded text: a byte-level tokenizer (GPT-2, Qwen, Llama 3, SmolLM2) can
split a character over several tokens, and `decode` shows the missing part as U+FFFD, but U+FFFD also stands
for bytes that no later byte can repair (shown at once) and for a U+FFFD the model wrote. Only the bytes say
which: a run of ids is complete when its bytes do not end inside a character that later bytes could finish.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

REPLACEMENT = "\ufffd"  # what `decode` shows for bytes that are not (yet) a character
MAX_OPEN_BYTES = 3  # a UTF-8 character has at most 4 bytes: at most 3 of them can wait for the rest


def token_bytes(tokenizer, token_id: int) -> bytes:
    """The raw bytes one token stands for; a byte-level token may hold only part of a UTF-8 character."""
    token = tokenizer.convert_ids_to_tokens(token_id)
    if token is None:  # an id past the tokenizer's own vocabulary (a model's rows can outnumber its pieces)
        return tokenizer.decode([token_id]).encode("utf-8")
    if _is_byte_level(tokenizer):
        table = _byte_decoder()
        if all(ch in table for ch in token):
            return bytes(table[ch] for ch in token)
    byte = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", token)  # SentencePiece byte fallback
    if byte:
        return bytes([int(byte.group(1), 16)])
    return tokenizer.decode([token_id]).encode("utf-8")


def open_tail(raw: bytes) -> int:
    """How many bytes at the end of `raw` begin a character that later bytes can still complete (0: `raw` ends
    on a character boundary). Bytes that are not UTF-8 and that no later byte can repair count as ended: they
    show at once (as U+FFFD in text, as bytes in a chip). Only the last 3 bytes matter: UTF-8 resynchronises at
    every byte that starts a character."""
    for size in range(min(MAX_OPEN_BYTES, len(raw)), 0, -1):
        try:
            raw[-size:].decode("utf-8")
        except UnicodeDecodeError as error:
            # Python names a character cut off by the end of the bytes "unexpected end of data"; where that
            # character starts at the first of these bytes, they are its beginning.
            if error.start == 0 and error.reason == "unexpected end of data":
                return size
    return 0


def ends_whole(tokenizer, ids: Sequence[int]) -> bool:
    """Whether the bytes of `ids` end on a character boundary (no character waits for more bytes)."""
    raw, start = b"", len(ids)
    while start > 0 and len(raw) < MAX_OPEN_BYTES:  # the last few ids: enough to hold the last 3 bytes
        start -= 1
        raw = token_bytes(tokenizer, ids[start]) + raw
    return open_tail(raw) == 0


def open_ids(tokenizer, ids: Sequence[int]) -> int:
    """How many ids at the end of `ids` come after its last character boundary: the ids of a character not
    finished yet (0: `ids` ends whole). These are the ids a token chip groups and the answer text holds back."""
    stop = len(ids)
    while stop > 0 and not ends_whole(tokenizer, ids[:stop]):
        stop -= 1
    return len(ids) - stop


def _is_byte_level(tokenizer) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend is not None and type(backend.decoder).__name__ == "ByteLevel"


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {char: byte for byte, char in bytes_to_unicode().items()}

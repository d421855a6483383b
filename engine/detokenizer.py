"""Incremental detokenization: the piece of text each new token id adds to what the user sees.

A byte-level tokenizer can split one character (a CJK character, an emoji) over several tokens;
decoding a partial character gives U+FFFD. We hold such bytes back until the character is complete,
so a piece never shows a broken character, and the pieces joined equal `tokenizer.decode(ids)`.
"""

from __future__ import annotations

import re
from functools import lru_cache
from os.path import commonprefix

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.shown = ""  # text already handed out

    def add(self, token_id: int, final: bool = False) -> str:
        """Append one id; return the new text that is safe to show (possibly ""). `final` flushes."""
        self.ids.append(token_id)
        return self._emit(final)

    def flush(self) -> str:
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        text = self.tokenizer.decode(self.ids)
        if not final and text.endswith(REPLACEMENT):
            return ""  # an unfinished multi-byte character: wait for its remaining bytes
        if not text.startswith(self.shown):
            # Decoding more ids rewrote earlier text (tokenizers with space clean-up can): the piece
            # starts at the first changed character; `self.shown` stays the true full decode.
            piece = text[len(commonprefix([text, self.shown])):]
        else:
            piece = text[len(self.shown) :]
        self.shown = text
        return piece



def token_bytes(tokenizer, token_id: int) -> bytes:
    """The raw bytes one token stands for; a byte-level token may hold only part of a UTF-8 character."""
    token = tokenizer.convert_ids_to_tokens(token_id)
    if _is_byte_level(tokenizer):
        table = _byte_decoder()
        if all(ch in table for ch in token):
            return bytes(table[ch] for ch in token)
    byte = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", token)  # SentencePiece byte fallback
    if byte:
        return bytes([int(byte.group(1), 16)])
    return tokenizer.decode([token_id]).encode("utf-8")


def _is_byte_level(tokenizer) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend is not None and type(backend.decoder).__name__ == "ByteLevel"


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {char: byte for byte, char in bytes_to_unicode().items()}

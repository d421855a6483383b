"""Incremental detokenization: the piece of answer text each new token id adds.

A byte-level tokenizer can split one character (a CJK character, an emoji) over several tokens;
decoding a partial character gives U+FFFD. Such bytes are held back until the character is complete
(and flushed as they are when the answer ends), so a piece never shows a broken character.

Each step decodes only a short window: a few ids already shown (for context) and the ids not shown
yet, the algorithm of tokenizers' `DecodeStream` and of vLLM's detokenizer. It is written out here
because `DecodeStream` (tokenizers 0.23) cannot flush the held bytes at the end, keeps its state
hidden (a failed step must be undone), and, seeded with a prompt that ends inside a character,
returns the prompt's text with the first answer piece.

The pieces joined are `tokenizer.decode(prompt + answer)` after `tokenizer.decode(prompt)`: the answer
decoded in context. For byte-level tokenizers (GPT-2, Qwen2/3, Llama 3, SmolLM2) that is exactly
`tokenizer.decode(answer)`. A SentencePiece decoder (Llama 2's Metaspace, then Strip) drops the first
space of any text it decodes, so `decode(answer)` loses the answer's leading space; after the prompt
that space is real text and the pieces keep it. Decoding never cleans up spaces (" ." → "."):
transformers skips that for BPE tokenizers anyway, and a clean-up could rewrite text already shown.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

REPLACEMENT = "\ufffd"
MAX_PARTIAL_IDS = 3  # a UTF-8 character has at most 4 bytes and an id at least one


class IncrementalDetokenizer:
    """The answer text after `prompt_ids`, one piece per id, in time independent of the answer's length.

    State: `_context` (the ids of the last piece shown, or the prompt's last character), its text, and
    `_held` (ids whose text is not shown yet). All immutable, so `copy.copy` is a snapshot.
    """

    def __init__(self, tokenizer, prompt_ids: Sequence[int]):
        self.tokenizer = tokenizer
        prompt = list(prompt_ids)
        whole = _end_of_whole_text(self._decode, prompt)
        self._context = tuple(prompt[_start_of_last_character(self._decode, prompt, whole):whole])
        self._context_text = self._decode(self._context)
        # Bytes of a character the prompt leaves unfinished are shown with the answer that completes it.
        self._held = tuple(prompt[whole:])

    def add(self, token_id: int, final: bool = False) -> str:
        """Append one id; return the new text that is safe to show (possibly ""). `final`: the answer's
        last id; held bytes are flushed as they are (U+FFFD for an unfinished character)."""
        held = self._held + (token_id,)
        text = self._decode(self._context + held)
        if text.endswith(REPLACEMENT) and not final:
            self._held = held  # an unfinished multi-byte character: wait for its remaining bytes
            return ""
        held_text = self._decode(held)
        if text.startswith(self._context_text):
            piece = text[len(self._context_text):]  # in context: a SentencePiece leading space is kept
        else:
            # SentencePiece byte fallback turns every byte of a run that is not valid UTF-8 into U+FFFD,
            # the context's too; what was shown stays, and the new ids are shown on their own.
            piece = held_text
        # The next context starts on a whole character: a byte run cut in two would decode as U+FFFD.
        self._context, self._context_text, self._held = held, held_text, ()
        return piece

    def _decode(self, ids: Sequence[int]) -> str:
        # Special tokens shown as text, as `tokenizer.decode` does by default; no clean-up (module docstring).
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _end_of_whole_text(decode, ids: list[int]) -> int:
    """The largest n ≥ len(ids) − 3 such that ids[:n] decodes to whole characters (no final U+FFFD);
    text still ending in U+FFFD before those ends in a real one (typed, or invalid bytes): whole."""
    for n in range(len(ids), max(0, len(ids) - MAX_PARTIAL_IDS) - 1, -1):
        if not decode(ids[:n]).endswith(REPLACEMENT):
            return n
    return len(ids)


def _start_of_last_character(decode, ids: list[int], end: int) -> int:
    """Where the ids of the last character before `end` start: the shortest tail that does not decode
    to a leading U+FFFD (the middle of a character)."""
    for start in range(end - 1, max(0, end - MAX_PARTIAL_IDS - 1) - 1, -1):
        if not decode(ids[start:end]).startswith(REPLACEMENT):
            return start
    return max(0, end - MAX_PARTIAL_IDS - 1)


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

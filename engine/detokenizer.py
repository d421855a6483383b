"""Incremental detokenization: the piece of answer text each new token id adds.

A byte-level tokenizer can split one character (a CJK character, an emoji) over several tokens;
decoding a partial character gives U+FFFD. Such bytes are held back until the character is complete
(and flushed as they are when the answer ends), so a piece never shows a broken character. "Complete" is
`engine.characters`' rule on the tokens' bytes, the one the token cells group by: the text and the chips
agree on where every character ends.

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

from collections.abc import Sequence

from engine.characters import ends_whole, open_ids


class IncrementalDetokenizer:
    """The answer text after `prompt_ids`, one piece per id, in time independent of the answer's length.

    State: `_context` (the ids of the last piece shown, or the prompt's last character), its text, and
    `_held` (ids whose text is not shown yet). All immutable, so `copy.copy` is a snapshot.
    """

    def __init__(self, tokenizer, prompt_ids: Sequence[int]):
        self.tokenizer = tokenizer
        prompt = list(prompt_ids)
        whole = len(prompt) - open_ids(tokenizer, prompt)
        # The ids of the prompt's last whole character (a group, as the token cells have it).
        last = whole - 1 - open_ids(tokenizer, prompt[: whole - 1]) if whole else 0
        self._context = tuple(prompt[last:whole])
        self._context_text = self._decode(self._context)
        # Bytes of a character the prompt leaves unfinished are shown with the answer that completes it.
        self._held = tuple(prompt[whole:])

    def add(self, token_id: int, final: bool = False) -> str:
        """Append one id; return the new text that is safe to show (possibly ""). `final`: the answer's
        last id; held bytes are flushed as they are (U+FFFD for an unfinished character)."""
        held = self._held + (token_id,)
        if not final and not ends_whole(self.tokenizer, held):
            self._held = held  # an unfinished multi-byte character: wait for its remaining bytes
            return ""
        text = self._decode(self._context + held)
        held_text = self._decode(held)
        if text.startswith(self._context_text):
            piece = text[len(self._context_text) :]  # in context: a SentencePiece leading space is kept
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

"""When decoding stops: the one rule every run that decodes token by token follows (a generation, a speculative
generation, an eviction run, a request a server serves). Plain Python, so the scheduler uses it without a model."""

from __future__ import annotations

from collections.abc import Container


def stop_reason(
    token_id: int,
    eos_ids: Container[int],
    answer_length: int,
    max_new_tokens: int,
    length: int = 0,
    context_limit: int | None = None,
    ignore_eos: bool = False,
) -> str | None:
    """Why decoding ends with `token_id`, the answer's `answer_length`-th token (None: it goes on):
    - "eos": an end-of-sequence token, unless `ignore_eos` (teacher forcing; a request asked for all its tokens);
    - "max_new_tokens": the answer's length limit;
    - "context_limit": the sequence, `length` tokens with this one, reaches `context_limit` (the next token would
      sit beyond the positions the model was trained on)."""
    if token_id in eos_ids and not ignore_eos:
        return "eos"
    if answer_length >= max_new_tokens:
        return "max_new_tokens"
    if context_limit is not None and length >= context_limit:
        return "context_limit"
    return None

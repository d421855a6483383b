"""Plain-data records of each forward step: what the app draws. All tensors are on the CPU."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch


@dataclass(frozen=True)
class Capture:
    """What a step records beyond ids, text and candidates.

    `attention_budget` bounds a prefill's attention record: rows (query positions) are kept from the
    last one backwards while layers × q_heads × rows × L stays within it, so the last row (the one that
    predicts the first answer token) is always there. A decode step has one row and always fits.
    """

    attention: bool = True
    residuals: bool = True
    attention_budget: int = 4_000_000  # float32 elements per tensor (probs and scores each): 16 MB


@dataclass
class Candidate:
    """One of the most likely next tokens, with its probability at each sampling stage."""

    token_id: int
    token: str  # the tokenizer's piece, e.g. "Ġthe"
    text: str  # what it decodes to on its own
    logit: float
    p_raw: float  # softmax of the raw logits
    p_temperature: float  # after dividing by the temperature
    p_top_k: float  # after top-k, renormalised
    p_top_p: float  # after top-p, renormalised: the distribution drawn from


@dataclass
class StepTrace:
    """One forward pass: prefill (all prompt tokens at once) or decode (one token)."""

    step: int  # 0 for prefill, then 1, 2, …
    phase: str  # "prefill" or "decode"
    input_ids: list[int]  # the ids this pass processed
    positions: list[int]
    kv_slots: list[tuple[int, int]]  # (physical block, offset) where each input's K/V was written
    block_table: list[int]  # logical → physical blocks after this step
    context_length: int  # cached positions after this step
    token_id: int  # the id sampled from this step's logits
    token: str  # its tokenizer piece
    text: str  # the text it adds for the user (held back while a character is incomplete)
    candidates: list[Candidate]
    timings_ms: dict[str, float]  # forward, sample, total
    stop_reason: str | None = None  # "eos", "max_new_tokens" or "context_limit" when this step ends the run
    # Heavy fields: dropped from older steps by `slim()` to keep a long run's memory bounded.
    logits: torch.Tensor | None = None  # (vocab,) float32, at the position that predicts the next token
    attention: torch.Tensor | None = None  # (layers, q_heads, rows, L) probabilities
    scores: torch.Tensor | None = None  # (layers, q_heads, rows, L) scaled scores, −inf where masked
    attention_rows: list[int] = field(default_factory=list)  # query positions of those rows
    residual: torch.Tensor | None = None  # (layers, 3, hidden): x0, x1 (after attention), x2 (after FFN)
    final_hidden: torch.Tensor | None = None  # (hidden,) after the final norm: lm_head's input
    next_input_embedding: torch.Tensor | None = None  # (hidden,) embed_tokens[token_id]: next step's input

    HEAVY = ("logits", "attention", "scores", "residual", "final_hidden", "next_input_embedding")

    def slim(self) -> None:
        """Drop the heavy tensors (kept: ids, positions, slots, text, candidates, timings)."""
        for name in self.HEAVY:
            setattr(self, name, None)
        self.attention_rows = []

    @property
    def is_slim(self) -> bool:
        return self.logits is None

    def to_dict(self) -> dict:
        """JSON-ready: tensors become nested lists."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                value = value.tolist()
            elif f.name == "candidates":
                value = [vars(c) for c in value]
            out[f.name] = value
        return out

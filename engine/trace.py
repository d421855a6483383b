"""Plain-data records of each forward step: what the app draws. All tensors are on the CPU."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

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
    layers: tuple[int, ...] | None = None  # record attention of these layers only (None: all)


NO_RECORD = Capture(attention=False, residuals=False)  # a pass that only fills the cache (or feeds `observe`)


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
class SplitKVTrace:
    """FlashDecoding at the position that predicts the next token, for every layer and Q head."""

    ranges: list[tuple[int, int]]  # each split's [start, end) over the cached positions
    max_score: torch.Tensor  # (layers, q_heads, S): m_i, −inf for an empty split
    exp_sum: torch.Tensor  # (layers, q_heads, S): l_i
    partial: torch.Tensor  # (layers, q_heads, S, head_dim): O_i
    weight: torch.Tensor  # (layers, q_heads, S): w_i / Σw
    merged: torch.Tensor  # (layers, q_heads, head_dim): what the layer used
    unsplit: torch.Tensor  # (layers, q_heads, head_dim): attention over all keys at once

    @property
    def max_abs_diff(self) -> torch.Tensor:
        """(layers, q_heads): max |merged − unsplit| over head_dim."""
        return (self.merged - self.unsplit).abs().amax(dim=-1)


@dataclass
class PrefixHit:
    """How a prefill used the prefix cache."""

    policy: str  # "block", "radix" or "whole"
    reused_tokens: int  # K/V taken from the cache, not recomputed
    computed_tokens: int  # prompt tokens this prefill computed
    unit: str  # "block" or "token": what `hits` is per
    hits: list[bool]  # per prompt block (block policy) or token: reused or not
    shared_blocks: list[int]  # cached physical blocks now in this sequence's table
    copied_blocks: list[int]  # new blocks filled by copying cached K/V (a partly reused block)


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
    prefix: PrefixHit | None = None  # prefill with a prefix cache
    reclaimed_blocks: list[int] = field(default_factory=list)  # cached blocks this step's allocations reclaimed
    # Sliding-window layers (ModelInfo.layer_windows): their own block table after this step (in the pool's
    # `window` pool) and the first position it still holds; empty and 0 for a model without such layers.
    window_block_table: list[int] = field(default_factory=list)
    window_start: int = 0
    # Heavy fields: dropped from older steps by `slim()` to keep a long run's memory bounded.
    logits: torch.Tensor | None = None  # (vocab,) float32, at the position that predicts the next token
    attention: torch.Tensor | None = None  # (layers, q_heads, rows, L) probabilities
    scores: torch.Tensor | None = None  # (layers, q_heads, rows, L) scaled scores, −inf where masked
    attention_rows: list[int] = field(default_factory=list)  # query positions of those rows
    residual: torch.Tensor | None = None  # (layers, 3, hidden): x0, x1 (after attention), x2 (after FFN)
    final_hidden: torch.Tensor | None = None  # (hidden,) after the final norm: lm_head's input
    # (hidden,) the next step's input for token_id: its embed_tokens row, plus position_embeddings[its
    # position] where ModelInfo.positions == "learned" (GPT-2); with RoPE the position enters in attention.
    next_input_embedding: torch.Tensor | None = None
    split: SplitKVTrace | None = None  # with kv_splits > 1

    HEAVY = ("logits", "attention", "scores", "residual", "final_hidden", "next_input_embedding", "split")

    def slimmed(self) -> StepTrace:
        """A copy without the heavy tensors (kept: ids, positions, slots, text, candidates, timings). A copy, not
        an edit: a page drawing this step from a run another page extends keeps the tensors it is reading."""
        return replace(self, attention_rows=[], **dict.fromkeys(self.HEAVY))

    @property
    def is_slim(self) -> bool:
        return self.logits is None

    @property
    def nbytes(self) -> int:
        """Bytes of this trace's tensors (the heavy fields, the split record's included)."""
        values = [getattr(self, name) for name in self.HEAVY]
        if self.split is not None:
            values += [getattr(self.split, f.name) for f in fields(self.split)]
        return sum(v.nbytes for v in values if isinstance(v, torch.Tensor))

    def to_dict(self) -> dict:
        """JSON-ready: tensors become nested lists; −inf (masked scores) and other non-finite numbers become None."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}


def _plain(value):
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if hasattr(value, "__dataclass_fields__"):
        return {k: _plain(v) for k, v in vars(value).items()}
    return value

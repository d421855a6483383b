"""Speculative decoding's drafts (engine.speculative verifies what they guess): each proposes up to k next tokens
with `guess`. Prompt lookup: the last n-gram found earlier in the text, and what followed it there. Early exit: the
model's own first n layers, then its final norm and lm_head. docs/architecture.md has the recipe for another."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from engine.checks import require_integer
from engine.errors import InvalidSettingError
from engine.kv_cache import BlockTable
from engine.model import Model
from engine.sampler import DRAFT, Sampling, distribution, sample
from engine.trace import NO_RECORD

DRAFTS = ("lookup", "early_exit")
MAX_GUESSES = 16  # k: more guesses than this would be rejected almost surely, each a row of work
MAX_NGRAM = 8  # prompt lookup's longest n-gram


@dataclass(frozen=True)
class Guesses:
    """What a draft proposes: token ids, and the draft's distribution each was drawn from ((len(ids), vocab) after the
    sampler's filters), None for a deterministic draft (q = one-hot)."""

    ids: list[int]
    q: torch.Tensor | None = None


class Draft(Protocol):
    """Proposes up to `k` next tokens for the sequence `ids`, whose first `table.length` positions are cached.
    `room`: how many tokens the answer may still add (transformers' `max_length` less the length)."""

    name: str
    k: int

    def guess(self, model: Model, table: BlockTable, ids: list[int], room: int, sampling: Sampling) -> Guesses: ...


class NoDraft:
    """No guesses: each pass is a plain decode step (the baseline the others are timed against)."""

    name, k = "none", 0

    def guess(self, model: Model, table: BlockTable, ids: list[int], room: int, sampling: Sampling) -> Guesses:
        return Guesses([])


class PromptLookup:
    """The continuation of the last n-gram where it occurred before (transformers' `PromptLookupCandidateGenerator`):
    n from `max_ngram` down to 1, the first occurrence from the left that has tokens after it, up to `k` of them,
    cut before an end-of-sequence token. Costs no model work; guesses well where the answer quotes the text."""

    name = "lookup"

    def __init__(self, k: int, max_ngram: int = 2):
        require_integer("k (guesses a pass)", k, 1, MAX_GUESSES)
        require_integer("max_ngram", max_ngram, 1, MAX_NGRAM)
        self.k, self.max_ngram = k, max_ngram

    def guess(self, model: Model, table: BlockTable, ids: list[int], room: int, sampling: Sampling) -> Guesses:
        if room <= 1:  # as transformers: no guesses when one token is left to make
            return Guesses([])
        return Guesses(prompt_lookup(ids, self.k, self.max_ngram, model.eos_ids))


def prompt_lookup(ids: Sequence[int], k: int, max_ngram: int, eos_ids: set[int] = frozenset()) -> list[int]:
    """Up to `k` tokens that followed the first earlier occurrence of the longest matching tail n-gram of `ids`."""
    n = len(ids)
    for size in range(min(max_ngram, n - 1), 0, -1):
        tail = list(ids[n - size :])
        for start in range(n - size + 1):
            if list(ids[start : start + size]) != tail or start + size >= n:
                continue
            found = list(ids[start + size : min(start + size + k, n)])
            cut = next((i for i, token in enumerate(found) if token in eos_ids), len(found))
            return found[:cut]
    return []


class EarlyExit:
    """The model's own first `layers` layers, then its final norm and lm_head (transformers' `assistant_early_exit`):
    one pass of those layers a guess, greedy or drawn as the sampler draws, stopping after an end-of-sequence token.
    Reads the K/V the full model cached for those layers, and writes its own for its guesses' positions (the verify
    pass writes them again). Costs layers/L of a step a guess: it pays only where those layers already predict
    what the whole model does."""

    name = "early_exit"

    def __init__(self, k: int, layers: int, model_layers: int):
        require_integer("k (guesses a pass)", k, 1, MAX_GUESSES)
        require_integer("early-exit layers", layers, 1, model_layers - 1, f" (the model has {model_layers} layers)")
        self.k, self.layers = k, layers

    def guess(self, model: Model, table: BlockTable, ids: list[int], room: int, sampling: Sampling) -> Guesses:
        count = min(self.k, room - 1)  # as transformers: the verify pass makes one token more
        mark, guesses, q_rows = table.length, [], []
        try:
            feed = ids[mark:]
            while len(guesses) < count:
                start = table.length
                table.append(len(feed))
                hidden = model.forward(
                    feed,
                    list(range(start, start + len(feed))),
                    table,
                    NO_RECORD,
                    head=False,
                    prefill=start == 0,
                    depth=self.layers,
                )
                logits = model.logits(hidden[-1])
                token, stages = sample(logits, sampling, len(ids) + len(guesses), DRAFT)  # indexed by position
                q = distribution(stages)
                guesses.append(token)
                q_rows.append(q)
                if token in model.eos_ids:
                    break
                feed = [token]
        finally:
            table.roll_back(mark)  # the verify pass reserves its own rows
        q = None if sampling.greedy or not q_rows else torch.stack(q_rows)
        return Guesses(guesses, q)


def make_draft(name: str, k: int, layers: int, model: Model, max_ngram: int = 2) -> Draft:
    """The draft `name` (one of DRAFTS, or "none") with its settings, checked."""
    if name == "none":
        return NoDraft()
    if name == "lookup":
        return PromptLookup(k, max_ngram)
    if name == "early_exit":
        return EarlyExit(k, layers, model.info.layers)
    raise InvalidSettingError(f"draft must be one of none, {', '.join(DRAFTS)}; got {name!r}")

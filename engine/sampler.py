"""Choosing the next token id from the logits, and the candidates a trace lists beside it.

Order and tie rules as in transformers' logits processors: temperature → top-k → top-p → softmax
→ multinomial draw; greedy (temperature 0) is argmax. Top-k keeps every token whose logit equals
the k-th largest; top-p keeps the smallest high-probability set whose mass exceeds p, found on an
ascending sort exactly as `TopPLogitsWarper` does.

Each step draws with its own generator seeded from (seed, step), so step N's draw depends only on
the seed, N and that step's logits: a link can rebuild any step, and stepping back then forward
draws the same token again.

Settings are checked when a `Sampling` is made, and refused with `InvalidSettingError`:
- temperature is 0 (greedy) or at least TEMPERATURE_FLOOR = 0.01; anything between is refused.
  The logits are divided by it in float32, whose largest value is 3.4e38: a real model's logits stay
  within about ±1e4, so at the floor they reach 1e6, far from overflow, while at 1e-38 every logit
  becomes ±inf and softmax gives NaN. Nothing is lost below the floor: at 0.01 a token 0.1 logit
  behind the top one is already e^−10 ≈ 5e-5 times as likely, so the draw is the greedy token
  except for near-exact ties.
- seed is an integer in [0, MAX_SEED = 2**32 − 1]: step N's generator is seeded with
  seed × 1,000,003 + N, which then stays below 2**64 (torch's limit) for any step count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from engine.checks import is_integer, require_integer
from engine.errors import InvalidSettingError
from engine.trace import Candidate

_STEP_SEED_STRIDE = 1_000_003  # a prime, so (seed, step) pairs map to distinct generator seeds
TEMPERATURE_FLOOR = 0.01  # the smallest temperature above 0 (see the module docstring)
MAX_SEED = 2**32 - 1  # seed × stride + step stays below torch's 2**64 for any step
TOP_CANDIDATES = 10  # candidates a trace lists, besides a drawn token outside them


@dataclass(frozen=True)
class Sampling:
    """temperature 0 means greedy; top_k 0 and top_p 1 switch those filters off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if not _is_number(self.temperature) or self.temperature < 0:
            raise InvalidSettingError(f"temperature must be a number ≥ 0 (0 = greedy), got {self.temperature!r}")
        if 0 < self.temperature < TEMPERATURE_FLOOR:
            raise InvalidSettingError(
                f"temperature must be 0 (greedy) or at least {TEMPERATURE_FLOOR}: smaller ones "
                f"overflow float32 logits; got {self.temperature!r}"
            )
        require_integer("top_k", self.top_k, 0, why=" (0 = off)")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise InvalidSettingError(f"top_p must be in (0, 1] (1 = off), got {self.top_p!r}")
        if not is_integer(self.seed) or not 0 <= self.seed <= MAX_SEED:  # tests/test_errors.py reads "in [0, …]"
            raise InvalidSettingError(f"seed must be an integer in [0, {MAX_SEED}], got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass
class FilterStages:
    """The logits (vocab,) after each stage; −inf marks a token a filter removed."""

    raw: torch.Tensor
    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return logits if temperature in (0, 1) else logits / temperature


def apply_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    if top_k == 0:
        return logits
    kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def apply_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    if top_p >= 1:
        return logits
    ascending, order = torch.sort(logits, descending=False)
    cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cumulative <= (1 - top_p)
    remove_sorted[..., -1:] = False  # always keep the most likely token
    remove = remove_sorted.scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


def filter_logits(logits: torch.Tensor, sampling: Sampling) -> FilterStages:
    if sampling.greedy:  # argmax: as in transformers, no filter applies
        return FilterStages(raw=logits, temperature=logits, top_k=logits, top_p=logits)
    tempered = apply_temperature(logits, sampling.temperature)
    top_k = apply_top_k(tempered, sampling.top_k)
    return FilterStages(raw=logits, temperature=tempered, top_k=top_k, top_p=apply_top_p(top_k, sampling.top_p))


# Independent streams of draws for one (seed, step): the plain draw's, and speculative decoding's draft and verifier
# (`engine.speculative`), whose draws must not be correlated with each other for its rejection rule to hold.
PLAIN, DRAFT, VERIFY = 0, 1, 2
_STREAM_STRIDE = 2**56  # above any seed × stride + step (< 2**53), and 2 × it + that stays below torch's 2**64


def step_generator(seed: int, step: int, stream: int = PLAIN) -> torch.Generator:
    return torch.Generator().manual_seed(stream * _STREAM_STRIDE + seed * _STEP_SEED_STRIDE + step)


def distribution(stages: FilterStages) -> torch.Tensor:
    """The probabilities a step draws from: softmax after every filter (greedy: of the raw logits, whose argmax it
    takes; what a trace's candidates list as `p_top_p`)."""
    return torch.softmax(stages.top_p, dim=-1)


def sample(logits: torch.Tensor, sampling: Sampling, step: int, stream: int = PLAIN) -> tuple[int, FilterStages]:
    """Draw the next id from float32 CPU logits (vocab,), on `stream` (argmax when greedy); return it and the
    filtered stages."""
    stages = filter_logits(logits, sampling)
    if sampling.greedy:
        return int(torch.argmax(logits)), stages
    probs = distribution(stages)
    drawn = torch.multinomial(probs, 1, generator=step_generator(sampling.seed, step, stream))
    return int(drawn), stages


def candidates(stages: FilterStages, tokenizer, drawn: int, count: int = TOP_CANDIDATES) -> list[Candidate]:
    """The `count` most likely tokens by raw logit, with their probability after each filter.

    The drawn token is appended when a sample picked one outside that list.
    """
    softmax: dict[int, torch.Tensor] = {}  # stages a filter left unchanged are the same tensor: one softmax
    probs = {}
    for name in ("raw", "temperature", "top_k", "top_p"):
        stage = getattr(stages, name)
        if id(stage) not in softmax:
            softmax[id(stage)] = torch.softmax(stage, dim=-1)
        probs[name] = softmax[id(stage)]
    ids = torch.topk(stages.raw, min(count, stages.raw.shape[-1])).indices.tolist()
    if drawn not in ids:
        ids.append(drawn)
    out = []
    for token_id in ids:
        out.append(
            Candidate(
                token_id=token_id,
                token=tokenizer.convert_ids_to_tokens(token_id),
                text=tokenizer.decode([token_id]),
                logit=float(stages.raw[token_id]),
                p_raw=float(probs["raw"][token_id]),
                p_temperature=float(probs["temperature"][token_id]),
                p_top_k=float(probs["top_k"][token_id]),
                p_top_p=float(probs["top_p"][token_id]),
            )
        )
    return out

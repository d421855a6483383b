"""Speculative decoding: guess several tokens cheaply, then check them all in one pass of the model.

A decode pass reads every weight and the whole cache to make one token, and a pass over k + 1 rows reads the same
bytes: where reading is what takes the time (decode on a GPU) it costs about as much. (On this project's 2-core CPU
a small matrix product computes more than it reads: 3 rows cost about twice one, bench/speculative.py.) A *draft*
guesses k tokens; one *verify* pass of the full model reads the last token and the guesses; the model keeps the
longest prefix of guesses it agrees with, plus its own next token. A pass therefore adds 1 to k + 1 tokens. A draft
the model rarely agrees with costs its own work for a token a pass, and is slower than no draft.

Agreeing, as transformers' assisted generation decides it (`generate(prompt_lookup_num_tokens=…)`,
`generate(assistant_early_exit=…)`, the references of bench/speculative_peer.py):
- greedy: a guess is kept while it equals the model's argmax at its row; the model's token after the last kept
  guess comes from the row after it. The tokens are plain greedy decoding's;
- sampling: the rejection rule (Leviathan et al. 2023, algorithm 1). Guess x is accepted with probability
  min(1, p(x)/q(x)), p the model's distribution at its row after the sampler's filters, q the draft's; at the first
  rejection the next token is drawn from (p − q)+ normalised; when every guess was accepted, from p. A
  deterministic draft has q = one-hot(x). The tokens are distributed as plain sampling's. Draws come from the
  page's seed, each decided token's own generator (`engine.sampler.step_generator`, streams DRAFT and VERIFY).

The drafts (`engine.drafts`): prompt lookup (the last n-gram found earlier in the text, and what followed it there), and
early exit (the model's own first n layers, then its final norm and lm_head). Each is one small class with
`guess`; docs/architecture.md has the recipe for another.

The cache: the first pass is the prefill, the prompt followed by the draft's guesses (transformers' first pass too).
A verify pass writes its k + 1 rows; the rows of rejected guesses are then forgotten (`BlockTable.roll_back`) and a
block they alone used goes back to the pool. The model's own next token is not yet in the cache: the next pass
feeds it first. The early-exit draft writes its first n layers' K/V into the same rows, which the verify pass then
writes again whole: for the positions before, those layers' K/V are the full model's, the same computation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from engine.checks import require_integer
from engine.detokenizer import IncrementalDetokenizer
from engine.drafts import Draft
from engine.errors import GenerationStateError, InvalidSettingError
from engine.kv_cache import DEFAULT_BLOCK_SIZE, BlockTable
from engine.model import Model
from engine.prompt import tokenize_prompt
from engine.sampler import VERIFY, Sampling, distribution, filter_logits, step_generator
from engine.settings import check_prompt_fits
from engine.stopping import stop_reason
from engine.stopwatch import Stopwatch
from engine.trace import NO_RECORD

# -- the verifier's rule --------------------------------------------------------------------------------------------


def acceptance(p_x: float, q_x: float) -> float:
    """The chance a guess x is kept: min(1, p(x)/q(x))."""
    return min(1.0, p_x / q_x)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Where the next token is drawn from after a rejection: (p − q)+ normalised, (vocab,)."""
    rest = torch.clamp(p - q, min=0)
    return rest / rest.sum()


@dataclass(frozen=True)
class Verdict:
    """How many guesses were kept, and the model's own token after them."""

    accepted: int
    token_id: int


def judge_greedy(top: list[int], guesses: list[int]) -> Verdict:
    """top: the model's argmax after each of len(guesses) + 1 rows. Guesses are kept while they equal it."""
    accepted = next((i for i, g in enumerate(guesses) if g != top[i]), len(guesses))
    return Verdict(accepted, top[accepted])


def judge_sampled(
    p: torch.Tensor, guesses: list[int], q: torch.Tensor | None, generator: Callable[[int], torch.Generator]
) -> Verdict:
    """p: (len(guesses) + 1, vocab), the model's distribution after each row; q: (len(guesses), vocab), the draft's
    (None: one-hot at each guess). Guess i is kept when a uniform draw from `generator(i)` is ≤ min(1, p(x)/q(x)) (≤ as
    transformers' `_speculative_sampling`); the token after the kept ones is drawn from `generator(i)` too: from
    (p − q)+ at a rejection, from p after them all."""
    vocab = p.shape[-1]
    for i, x in enumerate(guesses):
        g = generator(i)
        q_row = q[i] if q is not None else torch.nn.functional.one_hot(torch.tensor(x), vocab).to(p.dtype)
        if float(torch.rand(1, generator=g)) <= acceptance(float(p[i, x]), float(q_row[x])):
            continue
        return Verdict(i, int(torch.multinomial(residual(p[i], q_row), 1, generator=g)))
    return Verdict(len(guesses), int(torch.multinomial(p[-1], 1, generator=generator(len(guesses)))))


# -- the run --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VerifyPass:
    """One pass of the full model as plain data. Positions: the pass fed `fed` at `first_position` onward; the last
    len(guesses) + 1 rows each give the model's token after them."""

    index: int  # 0: the prefill's pass
    first_position: int
    fed: list[int]  # the tokens not yet cached (the prompt on the first pass, else the last token), then the guesses
    guesses: list[int]
    top: list[int]  # the model's most likely token after each of the last len(guesses) + 1 rows
    p_guess: list[float]  # the model's probability of each guess at its row, after the sampler's filters
    accepted: int  # guesses the model agreed with
    token_id: int  # the model's own token after them: the first miss's replacement, or the one after every guess
    added: list[int]  # the tokens the pass added: the accepted guesses, then token_id; cut after a token that stops
    slots: list[tuple[int, int]]  # (block, offset) of every row written, in order
    kept_rows: int  # rows whose K/V stay cached; the rest were discarded
    blocks_returned: list[int]  # blocks only the discarded rows used, back in the pool
    block_table: list[int]  # after the pass
    context_length: int  # positions cached after the pass
    text: str  # what the pass added to the answer's text
    draft_ms: float
    verify_ms: float
    stop_reason: str | None

    @property
    def rows_written(self) -> int:
        return len(self.slots)

    @property
    def rows_discarded(self) -> int:
        return len(self.slots) - self.kept_rows


class SpeculativeGeneration:
    """Generation for one prompt, one verify pass a `step()`, with `draft` guessing (see the module's docstring).

    generation = SpeculativeGeneration(model, "def f(x): ...", PromptLookup(k=5))
    while not generation.finished:
        done = generation.step()      # done.accepted of done.guesses kept, then done.token_id
    """

    def __init__(
        self,
        model: Model,
        prompt: str | Sequence[int],
        draft: Draft,
        *,
        chat: bool = False,
        sampling: Sampling | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        max_new_tokens: int = 256,
    ):
        require_integer("block_size", block_size, 1)
        require_integer("max_new_tokens", max_new_tokens, 1)
        self.model, self.draft = model, draft
        self.sampling = sampling or Sampling()
        self.max_new_tokens = max_new_tokens
        self.prompt_ids = tokenize_prompt(model, prompt, chat)
        check_prompt_fits(self.prompt_ids, model)
        limit = model.info.context_limit
        if len(self.prompt_ids) + draft.k >= limit:
            raise InvalidSettingError(
                f"k = {draft.k} guesses after this {len(self.prompt_ids)}-token prompt pass "
                f"{model.info.name}'s context of {limit} positions"
            )
        capacity = min(len(self.prompt_ids) + max_new_tokens, limit) + draft.k  # the last pass's guesses overhang
        self.table = BlockTable(model.new_pool(math.ceil(capacity / block_size), block_size))
        self.generated: list[int] = []
        self.passes: list[VerifyPass] = []
        self.detokenizer = IncrementalDetokenizer(model.tokenizer, self.prompt_ids)
        self.stop_reason: str | None = None
        self.closed = False

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.generated

    @property
    def finished(self) -> bool:
        return self.stop_reason is not None

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.passes)

    def step(self) -> VerifyPass:
        """One pass: the draft guesses, the model verifies every guess at once, the rejected rows are forgotten."""
        if self.closed:
            raise GenerationStateError("the generation is closed")
        if self.finished:
            raise GenerationStateError(f"generation has ended ({self.stop_reason})")
        model, table, ids, sampling = self.model, self.table, self.ids, self.sampling
        clock = Stopwatch()
        room = self.max_new_tokens - len(self.generated)
        guesses = self.draft.guess(model, table, ids, room, sampling)
        guessed = guesses.ids[: model.info.context_limit - len(ids)]  # no row past the positions the model knows
        clock.lap("draft")
        start = table.length
        fed = ids[start:] + guessed
        slots = table.append(len(fed))
        try:
            hidden = model.forward(
                fed, list(range(start, start + len(fed))), table, NO_RECORD, head=False, prefill=start == 0
            )
        except BaseException:
            table.roll_back(start)
            raise
        logits = model.logits(hidden[-len(guessed) - 1 :])  # (guesses + 1, vocab): the rows that decide tokens
        top, p = logits.argmax(-1).tolist(), distribution(filter_logits(logits, sampling))
        first = len(self.generated)  # the answer index the first decided token takes
        if sampling.greedy:
            verdict = judge_greedy(top, guessed)
        else:
            q = guesses.q[: len(guessed)] if guesses.q is not None else None
            verdict = judge_sampled(p, guessed, q, lambda i: step_generator(sampling.seed, first + i, VERIFY))
        clock.lap("verify")
        added, text = [], []
        for token in guessed[: verdict.accepted] + [verdict.token_id]:
            self.generated.append(token)
            added.append(token)
            self.stop_reason = stop_reason(
                token,
                model.eos_ids,
                len(self.generated),
                self.max_new_tokens,
                len(self.prompt_ids) + len(self.generated),
                model.info.context_limit,
            )
            text.append(self.detokenizer.add(token, final=self.finished))
            if self.finished:
                break
        kept = len(ids) - start + len(added) - 1  # the fed rows up to the last kept guess; the new token is not fed
        returned = table.roll_back(start + kept)
        table.slide()  # a sliding window's old blocks go back to the pool
        done = VerifyPass(
            index=len(self.passes),
            first_position=start,
            fed=fed,
            guesses=guessed,
            top=top,
            p_guess=[float(p[i, x]) for i, x in enumerate(guessed)],
            accepted=verdict.accepted,
            token_id=verdict.token_id,
            added=added,
            slots=slots,
            kept_rows=kept,
            blocks_returned=returned,
            block_table=list(table.blocks),
            context_length=table.length,
            text="".join(text),
            draft_ms=clock.timings_ms()["draft"],
            verify_ms=clock.timings_ms()["verify"],
            stop_reason=self.stop_reason,
        )
        self.passes.append(done)
        return done

    def run(self) -> list[int]:
        """Pass after pass to the end; the answer's ids."""
        while not self.finished:
            self.step()
        return list(self.generated)

    def close(self) -> None:
        """Return the generation's blocks to its pool."""
        if not self.closed:
            self.table.free()
            self.closed = True

    def __enter__(self) -> SpeculativeGeneration:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

"""Speculative decoding (engine/speculative.py): greedy equal to plain greedy decoding on every family and both
embedded models; the rejection rule on hand cases and in distribution; rejected rows leave no trace in the cache and
their blocks go back to the pool; bad settings refused. bench/speculative_peer.py checks guesses, accepted counts and
passes against transformers' assisted generation."""

import math

import pytest
import torch

import engine
from engine.drafts import EarlyExit, Guesses, NoDraft, PromptLookup, make_draft, prompt_lookup
from engine.speculative import SpeculativeGeneration, acceptance, judge_greedy, judge_sampled, residual
from tests.conftest import FAMILIES

# Repeats itself, so prompt lookup has something to find even on a random model's answer.
LOOPING = "one two three four five one two three four five one two three"
CODE_EDIT = (
    "Rewrite this function so that the variable x is called count. Reply with the code only.\n```python\n"
    "def total(items):\n    x = 0\n    for item in items:\n        x += item.price * item.quantity\n"
    "    return x\n```"
)
ZH_CODE_EDIT = (
    "把下面函数里的变量 x 改名为 count：\n```python\ndef total(items):\n    x = 0\n    for item in items:\n"
    "        x += item\n    return x\n```\n改名之后：\n```python\n"
)


def plain_greedy(model, prompt, max_new_tokens, chat=False) -> list[int]:
    with engine.Generation(model, prompt, chat=chat, max_new_tokens=max_new_tokens) as generation:
        generation.prefill()
        while not generation.finished:
            generation.step()
        return list(generation.generated)


def held_blocks(table) -> int:
    return len(table.blocks) + (len(table.window.blocks) if table.window is not None else 0)


def pool_used(table) -> int:
    pool = table.pool
    return pool.block_manager.used + (pool.window.block_manager.used if pool.window is not None else 0)


# -- prompt lookup --------------------------------------------------------------------------------------------------


def test_prompt_lookup_continues_the_first_earlier_occurrence_of_the_longest_tail():
    ids = [5, 1, 2, 3, 9, 1, 2, 4, 7, 1, 2]
    assert prompt_lookup(ids, 3, 2) == [3, 9, 1], "the tail 1 2 first occurs at index 1: what followed it there"
    assert prompt_lookup(ids, 10, 2) == [3, 9, 1, 2, 4, 7, 1, 2], "up to the end of the text, not past it"
    assert prompt_lookup([7, 4, 4, 2, 8, 4, 2], 2, 2) == [8, 4], "the 2-gram 4 2 wins over the 1-gram 2"
    assert prompt_lookup([7, 2, 3, 6, 2], 2, 2) == [3, 6], "no earlier 6 2: the 1-gram 2"
    assert prompt_lookup([7, 8, 9], 4, 2) == [], "a tail found nowhere before: no guess"
    assert prompt_lookup([3, 3], 4, 2) == [3], "the tail's own position is no match: nothing follows it"
    assert prompt_lookup([1, 2, 0, 5, 1, 2], 4, 2, eos_ids={5}) == [0], "cut before an end-of-sequence token"
    assert prompt_lookup([1, 2, 5, 0, 1, 2], 4, 2, eos_ids={5}) == [], "an end-of-sequence first: no guess"


# -- the rejection rule ---------------------------------------------------------------------------------------------


def seed_with_uniform(low: float, high: float) -> int:
    """A seed whose generator's first uniform draw lies in [low, high)."""
    return next(
        s for s in range(10_000) if low <= float(torch.rand(1, generator=torch.Generator().manual_seed(s))) < high
    )


def test_the_acceptance_and_the_residual_on_hand_cases():
    assert acceptance(0.3, 0.6) == pytest.approx(0.5)
    assert acceptance(0.6, 0.3) == 1.0, "a guess the model likes more than the draft is always kept"
    assert residual(torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.6, 0.2])).tolist() == pytest.approx([1, 0, 0])
    assert residual(torch.tensor([0.4, 0.4, 0.2]), torch.tensor([0.1, 0.3, 0.6])).tolist() == pytest.approx(
        [0.75, 0.25, 0.0]
    ), "(p − q)+ normalised: (0.3, 0.1, 0) / 0.4"


def test_a_guess_is_kept_when_the_uniform_draw_is_under_p_over_q():
    p = torch.tensor([[0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.1, 0.6, 0.2, 0.1]])  # guess 1: p/q = 0.5
    under, over = seed_with_uniform(0.3, 0.49), seed_with_uniform(0.51, 0.7)
    kept = judge_sampled(p, [1], q, lambda i: torch.Generator().manual_seed(under if i == 0 else 7))
    assert kept.accepted == 1
    rejected = judge_sampled(p, [1], q, lambda i: torch.Generator().manual_seed(over))
    assert rejected.accepted == 0
    assert rejected.token_id == 0, "after a rejection only (p − q)+ = (0.3, 0, 0, 0) is left: token 0"
    one_hot = judge_sampled(p, [3], None, lambda i: torch.Generator().manual_seed(seed_with_uniform(0.11, 0.9)))
    assert one_hot.accepted == 0 and one_hot.token_id != 3, (
        "a deterministic draft: kept with p(x) = 0.1, and the replacement never the rejected guess"
    )


@pytest.mark.parametrize("draft_q", [torch.tensor([0.4, 0.3, 0.2, 0.1]), None], ids=["drawn", "deterministic"])
def test_the_first_token_is_distributed_as_the_models_own_draw(draft_q):
    """Whatever the draft guesses, the token a pass decides first is distributed as p (the point of the rule): over
    4,000 seeds the counts match p within sampling error. A wrong ratio or residual misses by far more."""
    p = torch.tensor([0.1, 0.2, 0.3, 0.4])
    counts = torch.zeros(4)
    for seed in range(4000):
        if draft_q is None:
            guess, q = 0, None  # a deterministic draft always guessing the model's least likely token
        else:
            guess = int(torch.multinomial(draft_q, 1, generator=torch.Generator().manual_seed(10**6 + seed)))
            q = draft_q[None]
        verdict = judge_sampled(
            torch.stack([p, p]), [guess], q, lambda i, seed=seed: torch.Generator().manual_seed(seed * 7 + i)
        )
        counts[guess if verdict.accepted else verdict.token_id] += 1
    shares = counts / counts.sum()
    assert torch.allclose(shares, p, atol=0.025), shares.tolist()


def test_greedy_keeps_guesses_while_they_equal_the_argmax():
    assert judge_greedy([4, 5, 6, 7], [4, 5, 6]).__dict__ == {"accepted": 3, "token_id": 7}
    assert judge_greedy([4, 5, 6, 7], [4, 9, 6]).__dict__ == {"accepted": 1, "token_id": 5}
    assert judge_greedy([4], []).__dict__ == {"accepted": 0, "token_id": 4}


# -- the run --------------------------------------------------------------------------------------------------------


def check_blocks(generation: SpeculativeGeneration) -> None:
    """The pool holds exactly the table's blocks, and the table as many as its positions need."""
    table = generation.table
    assert len(table.blocks) == math.ceil(table.length / table.pool.block_size)
    assert pool_used(table) == held_blocks(table), "a block left in use by nothing, or a block given back twice"


@pytest.mark.parametrize("family", FAMILIES)
def test_speculative_greedy_equals_plain_greedy_on_every_family(tiny_model, family):
    model = tiny_model(family)
    plain = plain_greedy(model, LOOPING, 24)
    for draft in (NoDraft(), PromptLookup(4), EarlyExit(3, 1, model.info.layers)):
        with SpeculativeGeneration(model, LOOPING, draft, block_size=4, max_new_tokens=24) as generation:
            while not generation.finished:
                done = generation.step()
                assert done.rows_written == len(done.fed) and done.kept_rows <= done.rows_written
                check_blocks(generation)
            assert generation.generated == plain, draft.name
            assert sum(len(p.added) for p in generation.passes) == len(plain)
            if draft.name == "lookup":
                assert any(p.guesses for p in generation.passes), "the looping prompt gave prompt lookup nothing"
        assert pool_used(generation.table) == 0, "closing leaves a block held"


def test_speculative_greedy_equals_plain_greedy_on_smollm2(embedded_model):
    plain = plain_greedy(embedded_model, CODE_EDIT, 32, chat=True)
    for draft, tokens in ((PromptLookup(5), 32), (EarlyExit(4, 10, embedded_model.info.layers), 12)):
        with SpeculativeGeneration(embedded_model, CODE_EDIT, draft, chat=True, max_new_tokens=tokens) as generation:
            assert generation.run() == plain[:tokens], draft.name
            if draft.name == "lookup":
                assert len(generation.passes) < tokens * 0.75, "a code edit quotes itself: several tokens a pass"


def test_speculative_greedy_equals_plain_greedy_on_gemma(embedded_zh_model):
    plain = plain_greedy(embedded_zh_model, ZH_CODE_EDIT, 24)
    for draft, tokens in ((PromptLookup(5), 24), (EarlyExit(3, 6, embedded_zh_model.info.layers), 8)):
        with SpeculativeGeneration(embedded_zh_model, ZH_CODE_EDIT, draft, max_new_tokens=tokens) as generation:
            assert generation.run() == plain[:tokens], draft.name


class OtherMisses:
    """Replays `passes`' guesses, every rejected one changed to another token the model also rejects: the rows a
    pass discards differ, the rows it keeps do not."""

    name, k = "replay", 8

    def __init__(self, passes, vocab: int):
        self.passes, self.vocab, self.index = passes, vocab, 0

    def guess(self, model, table, ids, room, sampling) -> Guesses:
        done = self.passes[self.index]
        self.index += 1
        other = [
            g if i < done.accepted else next(t for t in range(g + 1, g + 50) if t != done.top[i]) % self.vocab
            for i, g in enumerate(done.guesses)
        ]
        return Guesses(other)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_rejected_rows_leave_no_trace_in_the_cache(tiny_model, family):
    """Two runs whose passes reject different tokens write bit-identical K/V at every position they keep, pass by pass,
    and make the same tokens: nothing of a discarded row is read later (a row left in the table would be). Against a
    plain run the K/V agree to float32 rounding only: a matrix product's rounding depends on its row count."""
    model = tiny_model(family)
    first = SpeculativeGeneration(model, LOOPING, PromptLookup(6), block_size=4, max_new_tokens=24)
    first.run()
    assert any(p.rows_discarded for p in first.passes), "no pass rejected a guess: nothing to check"
    second = SpeculativeGeneration(
        model, LOOPING, OtherMisses(first.passes, model.info.vocab), block_size=4, max_new_tokens=24
    )
    second.run()
    assert second.generated == first.generated
    assert [p.accepted for p in second.passes] == [p.accepted for p in first.passes]
    for layer in range(model.info.layers):
        k1, v1, start = first.table.read(layer)
        k2, v2, _ = second.table.read(layer)
        assert torch.equal(k1, k2) and torch.equal(v1, v2), layer
    with engine.Generation(model, LOOPING, block_size=4, max_new_tokens=24) as plain:
        plain.prefill()
        while not plain.finished:
            plain.step()
        length = first.table.length
        for layer in range(model.info.layers):
            k1, v1, start = first.table.read(layer)
            k0, v0, _ = plain.table.read(layer, length)
            assert torch.allclose(k1, k0[-len(k1) :], atol=1e-5) and torch.allclose(v1, v0[-len(v1) :], atol=1e-5)
    first.close(), second.close()


def test_a_block_only_rejected_rows_used_goes_back_to_the_pool(tiny_model):
    model = tiny_model("llama")
    with SpeculativeGeneration(model, LOOPING, PromptLookup(8), block_size=2, max_new_tokens=24) as generation:
        pool = generation.table.pool
        while not generation.finished:
            done = generation.step()
            check_blocks(generation)
            manager = pool.block_manager
            assert all(manager.ref_count[b] == 0 and b in manager.free for b in done.blocks_returned)
            assert {b for b, _ in done.slots[: done.kept_rows]} <= set(done.block_table), "a kept row's block left"
        assert any(p.blocks_returned for p in generation.passes), "no pass handed a block back: nothing checked"


def test_sampled_speculative_runs_repeat_with_their_seed(tiny_model):
    model = tiny_model("llama")
    sampling = engine.Sampling(temperature=0.8, top_k=20, seed=3)

    def answer(draft):
        with SpeculativeGeneration(model, LOOPING, draft, sampling=sampling, max_new_tokens=16) as generation:
            return generation.run(), [p.accepted for p in generation.passes]

    for draft in (PromptLookup(4), EarlyExit(3, 1, model.info.layers)):
        assert answer(draft) == answer(draft), draft.name


@pytest.mark.parametrize(
    "make",
    [
        lambda m: PromptLookup(0),
        lambda m: PromptLookup(17),
        lambda m: PromptLookup(2.0),
        lambda m: PromptLookup(True),
        lambda m: PromptLookup(3, max_ngram=0),
        lambda m: EarlyExit(3, m.info.layers, m.info.layers),
        lambda m: EarlyExit(3, 0, m.info.layers),
        lambda m: EarlyExit(3, "1", m.info.layers),
        lambda m: make_draft("medusa", 3, 1, m),
    ],
    ids=["k0", "k17", "k-float", "k-bool", "ngram0", "n-all-layers", "n0", "n-str", "unknown"],
)
def test_bad_draft_settings_are_refused(tiny_model, make):
    with pytest.raises(engine.InvalidSettingError):
        make(tiny_model("llama"))


def test_guesses_past_the_context_are_refused(tiny_model):
    model = tiny_model("llama")
    prompt = list(range(10, 10 + model.info.context_limit - 4))
    with pytest.raises(engine.InvalidSettingError, match="context"):
        SpeculativeGeneration(model, prompt, PromptLookup(5))
    SpeculativeGeneration(model, prompt, PromptLookup(3)).close()

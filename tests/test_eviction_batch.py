"""Eviction runs of one prompt stepped together (engine.eviction.batch) equal each run computed alone: the same kept
positions per (layer, KV head) after every pass, the same greedy tokens, logits within float rounding of a batched
product; and the batch's one prefill leaves every run's cache holding what its own prefill wrote."""

import pytest
import torch

from engine.errors import GenerationStateError
from engine.eviction import DecodeBudget, EvictionRun, Policy, StreamingWindow
from engine.eviction.batch import EvictionBatch, Variant

PROMPT = (
    "Serving systems keep a cache of keys and values; when it no longer fits, they evict some positions and "
    "keep the ones a score ranks highest, then decode"
)
LOGIT_ATOL = 1e-4
STEPS = 6
BLOCK = 5  # the 32-position context ends inside a block: the runs share 6 full blocks and copy the 7th
VARIANTS = [
    Variant(None),
    Variant(Policy("snapkv", window_size=8), compression_ratio=0.5),
    Variant(Policy("tova"), compression_ratio=0.4),
    Variant(Policy("streaming_llm"), compression_ratio=0.5),
    Variant(Policy("observed_attention"), compression_ratio=0.3),
    Variant(Policy("knorm"), budget=DecodeBudget(12, 2)),
    Variant(None, budget=StreamingWindow(2, 9)),
]


def alone(model, ids, variant: Variant) -> EvictionRun:
    run = EvictionRun(
        model,
        ids,
        variant.policy,
        compression_ratio=variant.compression_ratio,
        budget=variant.budget,
        block_size=BLOCK,
        max_new_tokens=STEPS,
        keep_full_steps=STEPS,
        rerotate=variant.rerotate,
    )
    run.prefill()
    while not run.finished:
        run.step()
    return run


def kept_by_pass(run: EvictionRun) -> list[list]:
    return [[None if m is None else m.tolist() for m in step.kept] for step in run.steps]


ROTARY_ONLY = [
    Variant(Policy("snapkv", window_size=8), compression_ratio=0.5, rerotate=True),
    Variant(Policy("streaming_llm"), compression_ratio=0.5, rerotate=True),
]  # not Gemma 3's, nor GPT-2's


def assert_each_equals_its_run_alone(model, ids, variants, runs) -> None:
    """Each run equals its variant's run alone: tokens, what each pass read, logits, and the cache it ends with."""
    for variant, together in zip(variants, runs, strict=True):
        solo = alone(model, ids, variant)
        assert together.generated == solo.generated, variant
        assert kept_by_pass(together) == kept_by_pass(solo), variant
        for a, b in zip(together.steps, solo.steps):
            torch.testing.assert_close(a.logits, b.logits, atol=LOGIT_ATOL, rtol=0)
        for layer in range(model.info.layers):  # the cache itself: what the run's last pass could read
            for kv_head in range(model.info.kv_heads):
                assert together.kept_positions(layer, kv_head) == solo.kept_positions(layer, kv_head)
            k_batch, v_batch, _ = together.table.read(layer)
            k_solo, v_solo, _ = solo.table.read(layer)
            torch.testing.assert_close(k_batch, k_solo, atol=1e-5, rtol=0)
            torch.testing.assert_close(v_batch, v_solo, atol=1e-5, rtol=0)
        solo.close()


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3", "gpt2"])
def test_batched_runs_equal_each_run_alone(family, tiny_model):
    model = tiny_model(family)
    ids = model.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    variants = VARIANTS + (ROTARY_ONLY if family in ("llama", "qwen3") else [])
    batch = EvictionBatch(model, ids, variants, block_size=BLOCK, max_new_tokens=STEPS, keep_full_steps=STEPS)
    batch.prefill()
    while not batch.finished:
        batch.step()
    assert_each_equals_its_run_alone(model, ids, variants, batch.runs)
    batch.close()
    assert batch.pool.block_manager.used == 0  # every run's blocks, the shared ones included, went back


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_runs_that_join_after_the_prefill_equal_each_run_alone(family, tiny_model):
    """A batch of the full cache alone, stepped twice; then each other variant joins, catches up in batched passes of
    its own and steps with the batch: every run equals its run alone, and closing frees every block."""
    model = tiny_model(family)
    ids = model.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    batch = EvictionBatch(
        model, ids, VARIANTS[:1], block_size=BLOCK, max_new_tokens=STEPS, keep_full_steps=STEPS, spare=len(VARIANTS) - 1
    )
    batch.prefill()
    batch.step()
    joined = [batch.join(variant) for variant in VARIANTS[1:]]
    assert all(not run.steps for run in joined)
    while len(joined[0].steps) < len(batch.runs[0].steps):
        batch.passes(joined)
    batch.runs.extend(joined)
    while not batch.finished:
        batch.step()
    assert_each_equals_its_run_alone(model, ids, VARIANTS, batch.runs)
    with pytest.raises(GenerationStateError):
        EvictionBatch(model, ids, VARIANTS[:1]).join(VARIANTS[1])
    batch.close()
    assert batch.pool.block_manager.used == 0


def test_a_batch_of_one_is_the_run_alone(tiny_model):
    model = tiny_model("llama")
    ids = model.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    variant = VARIANTS[1]
    batch = EvictionBatch(model, ids, [variant], block_size=BLOCK, max_new_tokens=STEPS, keep_full_steps=STEPS)
    batch.prefill()
    while not batch.finished:
        batch.step()
    solo = alone(model, ids, variant)
    for a, b in zip(batch.runs[0].steps, solo.steps):  # one row: the very same products
        assert torch.equal(a.logits, b.logits)


def test_forked_tables_write_their_own_positions(tiny_model):
    """Two runs after the shared prefill write different tokens at the same position: neither sees the other's."""
    model = tiny_model("llama")
    ids = model.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    batch = EvictionBatch(model, ids, [Variant(None), Variant(None)], block_size=BLOCK, max_new_tokens=2)
    batch.prefill()
    first, second = batch.runs
    n = first.table.length
    assert n % BLOCK  # a partly filled last block
    shared = set(first.table.blocks) & set(second.table.blocks)
    assert len(shared) == n // BLOCK  # the full blocks only
    for run, token in ((first, 5), (second, 6)):  # the next position, each its own token
        opened = run.open_pass(token, n)
        run.close_pass(opened, model.forward_batch([opened])[0])
    k_first, _, _ = first.table.read(0)
    k_second, _, _ = second.table.read(0)
    assert torch.equal(k_first[:n], k_second[:n])
    assert not torch.allclose(k_first[n], k_second[n])


def test_a_runs_records_count_every_evictions_rows(tiny_model):
    """What a run keeps about its passes (`records_nbytes`, which the run store counts) includes each eviction's rows:
    a streaming window evicts at every pass, so its records hold at least the positions it ranked each time."""
    model = tiny_model("llama")
    ids = model.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    run = alone(model, ids, Variant(None, budget=StreamingWindow(2, 9)))
    rows = sum(8 * e.positions.numel() for step in run.steps for e in step.evictions if e is not None)
    assert rows > 0 and run.records_nbytes() >= rows + sum(s.evicted_share.nbytes for s in run.steps)
    run.close()

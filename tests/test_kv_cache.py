"""The paged KV cache: paged equals contiguous, incremental equals fresh prefill, blocks come back."""

import copy
from collections import OrderedDict

import pytest
import torch

import engine
from engine.kv_cache import BlockPool, BlockTable
from tests.runs import decode

PROMPT = "Paged attention stores the cache in blocks"  # not a multiple of 4 or 16 tokens


def run(model, prompt, block_size, steps):
    return decode(model, prompt, steps, block_size=block_size, max_new_tokens=steps + 1)


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_paged_equals_contiguous(block_size, tiny_model):
    model = tiny_model("llama")
    steps = 11
    contiguous, reference = run(model, PROMPT, block_size=4096, steps=steps)  # one block holds everything
    paged, traces = run(model, PROMPT, block_size=block_size, steps=steps)
    length = paged.table.length
    assert length % block_size != 0 or block_size == 1
    assert len(paged.table.blocks) == -(-length // block_size)
    assert len(contiguous.table.blocks) == 1
    for ours, theirs in zip(traces, reference):
        assert ours.token_id == theirs.token_id
        torch.testing.assert_close(ours.logits, theirs.logits, atol=1e-6, rtol=0)
        torch.testing.assert_close(ours.attention, theirs.attention, atol=1e-6, rtol=0)
    for layer in range(model.info.layers):
        ours = paged.pool.read(layer, paged.table.device_blocks(), length)
        theirs = contiguous.pool.read(layer, contiguous.table.device_blocks(), length)
        assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])


def test_kv_slots_follow_the_block_table(tiny_model):
    generation, traces = run(tiny_model("llama"), PROMPT, block_size=4, steps=6)
    positions = [p for t in traces for p in t.positions]
    slots = [s for t in traces for s in t.kv_slots]
    assert positions == list(range(len(positions)))
    for position, (block, offset) in zip(positions, slots):
        assert block == generation.table.blocks[position // 4] and offset == position % 4


def test_incremental_decode_equals_a_fresh_prefill(tiny_model):
    model = tiny_model("qwen3")
    generation, traces = run(model, PROMPT, block_size=4, steps=9)
    # All tokens but the last sampled one have been processed; prefill them afresh in one pass.
    fresh = engine.Generation(model, generation.ids[:-1], block_size=16, max_new_tokens=1)
    trace = fresh.prefill()
    torch.testing.assert_close(trace.logits, traces[-1].logits, atol=1e-5, rtol=0)
    assert trace.token_id == traces[-1].token_id
    torch.testing.assert_close(trace.attention[:, :, -1], traces[-1].attention[:, :, -1], atol=1e-6, rtol=0)
    for layer in range(model.info.layers):
        ours = generation.pool.read(layer, generation.table.device_blocks(), generation.table.length)
        theirs = fresh.pool.read(layer, fresh.table.device_blocks(), fresh.table.length)
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


def test_close_returns_every_block_to_the_pool(tiny_model):
    generation, _ = run(tiny_model("llama"), PROMPT, block_size=4, steps=5)
    assert generation.pool.block_manager.used == len(generation.table.blocks) > 0
    generation.close()
    assert generation.pool.block_manager.used == 0
    assert len(generation.pool.block_manager.free) == generation.pool.num_blocks


def test_pool_refuses_to_overflow_and_counts_bytes():
    pool = BlockPool(layers=28, kv_heads=8, head_dim=128, num_blocks=2, block_size=4, dtype=torch.bfloat16)
    assert pool.bytes_per_token == 114_688  # Qwen3-0.6B in bf16: 112 KiB per token
    table = BlockTable(pool)
    table.append(8)
    with pytest.raises(engine.CacheFullError):
        table.append(1)


def test_a_table_that_cannot_grow_enough_takes_no_block():
    pool = BlockPool(layers=1, kv_heads=1, head_dim=2, num_blocks=3, block_size=4)
    holder, table = BlockTable(pool), BlockTable(pool)
    holder.append(1)
    free = list(pool.block_manager.free)
    with pytest.raises(engine.CacheFullError, match="3 more blocks are needed and 2 of 3 are free"):
        table.append(9)  # 3 blocks; only 2 are free: none is taken, rather than 2 then a failure
    assert (table.blocks, table.length, list(pool.block_manager.free)) == ([], 0, free)
    mark = table.mark()
    table.append(5)
    table.roll_back(mark)  # what a failed step does: its blocks go back, last first, to the end of the free list
    manager = pool.block_manager
    assert (table.blocks, table.length, list(manager.free), manager.ref_count) == ([], 0, free[::-1], [1, 0, 0])


def test_long_runs_keep_only_recent_full_traces(tiny_model):
    generation = engine.Generation(tiny_model("llama"), PROMPT, max_new_tokens=40, keep_full_traces=8)
    generation.prefill()
    for _ in range(20):
        generation.step()
    full = [t for t in generation.traces if not t.is_slim]
    assert len(full) == 8 and full == generation.traces[-8:]
    assert all(t.attention is None and t.logits is None and t.text is not None for t in generation.traces[:-8])


def test_prefill_attention_record_is_bounded_but_keeps_the_last_row(tiny_model):
    model = tiny_model("llama")
    info = model.info
    capture = engine.Capture(attention_budget=info.layers * info.q_heads * 60 * 3)  # three rows of 60
    prompt = list(range(100, 160))
    trace = engine.Generation(model, prompt, capture=capture, max_new_tokens=2).prefill()
    assert trace.attention.shape == (info.layers, info.q_heads, 3, 60)
    assert trace.attention_rows == [57, 58, 59]
    full = engine.Generation(model, prompt, max_new_tokens=2).prefill()
    assert torch.equal(trace.attention, full.attention[:, :, -3:])


def test_full_attention_recomputes_the_rows_decode_recorded(tiny_model):
    model = tiny_model("llama")
    generation, traces = run(model, PROMPT, block_size=4, steps=6)
    probs, scores = model.full_attention(generation.ids[:-1], layer=1)
    n = len(generation.ids) - 1
    assert probs.shape == (model.info.q_heads, n, n)
    prompt_len = len(generation.prompt_ids)
    torch.testing.assert_close(probs[:, :prompt_len, :prompt_len], traces[0].attention[1], atol=1e-6, rtol=0)
    for trace in traces[1:]:
        position = trace.positions[0]
        torch.testing.assert_close(probs[:, position, : position + 1], trace.attention[1, :, 0], atol=1e-6, rtol=0)


def test_scattered_blocks_equal_consecutive_ones(tiny_model):
    """A block table that jumps around the pool (read by gathering) gives the same numbers as a run of
    consecutive blocks (read as a view)."""
    model = tiny_model("qwen3")
    ordered, reference = run(model, PROMPT, block_size=2, steps=6)
    assert ordered.table.first_of_run() == 0
    scattered = engine.Generation(model, PROMPT, block_size=2, max_new_tokens=7)
    manager = scattered.pool.block_manager
    manager.free = OrderedDict.fromkeys(reversed(manager.free))  # hand out the last block first
    traces = [scattered.prefill()] + [scattered.step() for _ in range(6)]
    assert scattered.table.first_of_run() is None and scattered.table.blocks[0] > scattered.table.blocks[1]
    for ours, theirs in zip(traces, reference):
        assert ours.token_id == theirs.token_id
        torch.testing.assert_close(ours.logits, theirs.logits, atol=1e-6, rtol=0)


def test_trace_memory_stays_bounded_over_500_steps(tiny_model):
    """Heavy tensors are kept for the latest steps only, so what a long run holds stops growing."""
    model = tiny_model("llama-long")
    generation = engine.Generation(model, PROMPT, max_new_tokens=501, keep_full_traces=8)
    generation.prefill()

    def held_bytes() -> int:
        return sum(
            t.numel() * t.element_size()
            for trace in generation.traces
            for name in trace.HEAVY
            for t in [getattr(trace, name)]
            if isinstance(t, torch.Tensor)
        )

    for _ in range(100):
        generation.step()
    at_100 = held_bytes()
    for _ in range(400):
        generation.step()
    at_500 = held_bytes()
    assert sum(not t.is_slim for t in generation.traces) == 8
    # Only the attention rows of the 8 kept steps grow, with the context (108 → 508 positions).
    assert at_500 < at_100 * 508 / 108
    assert at_500 < 8 * 4 * (model.info.vocab + 2 * model.info.layers * model.info.q_heads * 520 + 4 * 64 * 3)


# -- rebuilding an old step from the cache ------------------------------------------------------


def pool_state(generation) -> tuple:
    """Everything a rebuild must leave as it was: K/V bytes (unwritten slots too), ref counts, free
    order, the block table, the tokens and which traces are slim."""
    pool = generation.pool
    return (
        pool.k.view(torch.uint8).clone(),
        pool.v.view(torch.uint8).clone(),
        list(pool.block_manager.ref_count),
        list(pool.block_manager.free),
        list(generation.table.blocks),
        generation.table.length,
        list(generation.generated),
        [trace.is_slim for trace in generation.traces],
        generation.text,
    )


def assert_same_state(before: tuple, after: tuple) -> None:
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1]), "cached K/V changed"
    assert before[2:] == after[2:]


def assert_same_trace(rebuilt, original) -> None:
    assert rebuilt.token_id == original.token_id and rebuilt.step == original.step
    assert rebuilt.attention_rows == original.attention_rows
    for name in ("logits", "attention", "scores", "residual", "final_hidden", "next_input_embedding"):
        torch.testing.assert_close(getattr(rebuilt, name), getattr(original, name), atol=1e-5, rtol=0)
    assert [c.token_id for c in rebuilt.candidates] == [c.token_id for c in original.candidates]
    for ours, theirs in zip(rebuilt.candidates, original.candidates):
        assert ours.p_top_p == pytest.approx(theirs.p_top_p, abs=1e-5)
        assert ours.logit == pytest.approx(theirs.logit, abs=1e-5)


def counting_forwards(monkeypatch) -> list:
    calls = []
    original = engine.Model.forward
    monkeypatch.setattr(engine.Model, "forward", lambda self, *a, **k: calls.append(a[1]) or original(self, *a, **k))
    return calls


@pytest.mark.parametrize("kv_splits", [1, 3])
def test_rebuilding_an_old_step_is_one_forward_pass_equal_to_the_original(kv_splits, tiny_model, monkeypatch):
    generation = engine.Generation(
        tiny_model("llama"),
        PROMPT,
        sampling=engine.Sampling(temperature=1.0, seed=7),
        block_size=4,
        kv_splits=kv_splits,
        keep_full_traces=4,
        max_new_tokens=40,
    )
    originals = [copy.copy(generation.prefill())] + [
        copy.copy(generation.step()) for _ in range(29)
    ]  # keep the tensors
    assert generation.traces[5].is_slim and generation.traces[0].is_slim
    before = pool_state(generation)
    calls = counting_forwards(monkeypatch)
    for index in (5, 0, 29):
        rebuilt = generation.rebuild(index)
        assert_same_trace(rebuilt, originals[index])
        if kv_splits > 1:
            torch.testing.assert_close(rebuilt.split.merged, originals[index].split.merged, atol=1e-5, rtol=0)
    assert [len(positions) for positions in calls] == [1, len(generation.prompt_ids), 1]  # one pass each
    assert_same_state(before, pool_state(generation))
    assert generation.traces[5].is_slim  # the generation's own record stays slim: the rebuilt trace is a copy
    generation.step()  # and the run goes on as if nothing happened


def test_kept_traces_stay_within_their_bytes_and_the_newest_always_keeps_its_own(tiny_model):
    model = tiny_model("llama")
    generation = engine.Generation(model, PROMPT, kv_splits=3, keep_full_traces=8, max_new_tokens=20)
    generation.prefill()
    step = generation.step().nbytes
    generation.full_trace_bytes = int(2.5 * step)  # room for two steps' tensors, not three
    originals = [copy.copy(generation.step()) for _ in range(6)]
    full = [index for index, trace in enumerate(generation.traces) if not trace.is_slim]
    assert full == [len(generation.traces) - 2, len(generation.traces) - 1], full
    assert_same_trace(generation.rebuild(len(generation.traces) - 3), originals[-3])  # a slimmed one comes back whole
    generation.full_trace_bytes = 1  # less than one step's: the newest keeps its own
    generation.step()
    assert [trace.is_slim for trace in generation.traces[-2:]] == [True, False]


def test_rebuilding_a_prefill_after_a_prefix_hit_reads_the_reused_kv(tiny_model, monkeypatch):
    model = tiny_model("llama")
    cache = engine.PrefixCache(model, policy="radix", block_size=4, capacity_blocks=64)
    with engine.Generation(model, PROMPT, prefix_cache=cache) as first:
        first.prefill()
    generation = engine.Generation(
        model,
        PROMPT + " and reads them back",
        prefix_cache=cache,
        keep_full_traces=1,
        sampling=engine.Sampling(temperature=0.8, seed=3),
    )
    prefill = copy.copy(generation.prefill())
    assert prefill.prefix.reused_tokens > 0 and prefill.positions[0] == prefill.prefix.reused_tokens
    for _ in range(3):
        generation.step()
    before, evictions, held = pool_state(generation), list(cache.reclaims), cache.cached_blocks
    calls = counting_forwards(monkeypatch)
    rebuilt = generation.rebuild(0)
    assert [len(positions) for positions in calls] == [prefill.prefix.computed_tokens]  # not the reused ones
    assert_same_trace(rebuilt, prefill)
    assert rebuilt.prefix == prefill.prefix
    assert_same_state(before, pool_state(generation))
    assert list(cache.reclaims) == evictions and cache.cached_blocks == held
    generation.close()


def test_rebuild_refuses_what_it_cannot_rebuild(tiny_model):
    generation = engine.Generation(tiny_model("llama"), PROMPT, keep_full_traces=1)
    with pytest.raises(engine.GenerationStateError, match="has not run"):
        generation.rebuild(0)
    generation.prefill()
    generation.step()
    with pytest.raises(engine.GenerationStateError, match="has not run"):
        generation.rebuild(2)
    generation.traces[1].token_id += 1  # a record that no longer matches the cache: a bug, never a silent wrong trace
    with pytest.raises(RuntimeError, match="drew token"):
        generation.rebuild(1)
    generation.close()
    with pytest.raises(engine.GenerationStateError, match="closed"):
        generation.rebuild(0)

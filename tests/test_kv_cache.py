"""The paged KV cache: paged equals contiguous, incremental equals fresh prefill, blocks come back."""

from collections import OrderedDict

import pytest
import torch

import engine
from engine.kv_cache import BlockPool, BlockTable

PROMPT = "Paged attention stores the cache in blocks"  # not a multiple of 4 or 16 tokens


def run(model, prompt, block_size, steps):
    session = engine.DecodeSession(model, prompt, block_size=block_size, max_new_tokens=steps + 1)
    traces = [session.prefill()] + [session.step() for _ in range(steps)]
    return session, traces


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
    session, traces = run(tiny_model("llama"), PROMPT, block_size=4, steps=6)
    positions = [p for t in traces for p in t.positions]
    slots = [s for t in traces for s in t.kv_slots]
    assert positions == list(range(len(positions)))
    for position, (block, offset) in zip(positions, slots):
        assert block == session.table.blocks[position // 4] and offset == position % 4


def test_incremental_decode_equals_a_fresh_prefill(tiny_model):
    model = tiny_model("qwen3")
    session, traces = run(model, PROMPT, block_size=4, steps=9)
    # All tokens but the last sampled one have been processed; prefill them afresh in one pass.
    fresh = engine.DecodeSession(model, session.ids[:-1], block_size=16, max_new_tokens=1)
    trace = fresh.prefill()
    torch.testing.assert_close(trace.logits, traces[-1].logits, atol=1e-5, rtol=0)
    assert trace.token_id == traces[-1].token_id
    torch.testing.assert_close(trace.attention[:, :, -1], traces[-1].attention[:, :, -1], atol=1e-6, rtol=0)
    for layer in range(model.info.layers):
        ours = session.pool.read(layer, session.table.device_blocks(), session.table.length)
        theirs = fresh.pool.read(layer, fresh.table.device_blocks(), fresh.table.length)
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


def test_close_returns_every_block_to_the_pool(tiny_model):
    session, _ = run(tiny_model("llama"), PROMPT, block_size=4, steps=5)
    assert session.pool.used_blocks == len(session.table.blocks) > 0
    session.close()
    assert session.pool.used_blocks == 0
    assert len(session.pool.free) == session.pool.num_blocks


def test_pool_refuses_to_overflow_and_counts_bytes():
    pool = BlockPool(layers=28, kv_heads=8, head_dim=128, num_blocks=2, block_size=4, dtype=torch.bfloat16)
    assert pool.bytes_per_token == 114_688  # Qwen3-0.6B in bf16: 112 KiB per token
    table = BlockTable(pool)
    table.append(8)
    with pytest.raises(engine.CacheFullError):
        table.append(1)


def test_long_runs_keep_only_recent_full_traces(tiny_model):
    session = engine.DecodeSession(tiny_model("llama"), PROMPT, max_new_tokens=40, keep_full_traces=8)
    session.prefill()
    for _ in range(20):
        session.step()
    full = [t for t in session.traces if not t.is_slim]
    assert len(full) == 8 and full == session.traces[-8:]
    assert all(t.attention is None and t.logits is None and t.text is not None for t in session.traces[:-8])


def test_prefill_attention_record_is_bounded_but_keeps_the_last_row(tiny_model):
    model = tiny_model("llama")
    info = model.info
    capture = engine.Capture(attention_budget=info.layers * info.q_heads * 60 * 3)  # three rows of 60
    prompt = list(range(100, 160))
    trace = engine.DecodeSession(model, prompt, capture=capture, max_new_tokens=2).prefill()
    assert trace.attention.shape == (info.layers, info.q_heads, 3, 60)
    assert trace.attention_rows == [57, 58, 59]
    full = engine.DecodeSession(model, prompt, max_new_tokens=2).prefill()
    assert torch.equal(trace.attention, full.attention[:, :, -3:])


def test_full_attention_recomputes_the_rows_decode_recorded(tiny_model):
    model = tiny_model("llama")
    session, traces = run(model, PROMPT, block_size=4, steps=6)
    probs, scores = model.full_attention(session.ids[:-1], layer=1)
    n = len(session.ids) - 1
    assert probs.shape == (model.info.q_heads, n, n)
    prompt_len = len(session.prompt_ids)
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
    scattered = engine.DecodeSession(model, PROMPT, block_size=2, max_new_tokens=7)
    scattered.pool.free = OrderedDict.fromkeys(reversed(scattered.pool.free))  # hand out the last block first
    traces = [scattered.prefill()] + [scattered.step() for _ in range(6)]
    assert scattered.table.first_of_run() is None and scattered.table.blocks[0] > scattered.table.blocks[1]
    for ours, theirs in zip(traces, reference):
        assert ours.token_id == theirs.token_id
        torch.testing.assert_close(ours.logits, theirs.logits, atol=1e-6, rtol=0)


def test_trace_memory_stays_bounded_over_500_steps(tiny_model):
    """Heavy tensors are kept for the latest steps only, so what a long run holds stops growing."""
    model = tiny_model("llama-long")
    session = engine.DecodeSession(model, PROMPT, max_new_tokens=501, keep_full_traces=8)
    session.prefill()

    def held_bytes() -> int:
        return sum(t.numel() * t.element_size() for trace in session.traces for name in trace.HEAVY
                   for t in [getattr(trace, name)] if isinstance(t, torch.Tensor))

    for _ in range(100):
        session.step()
    at_100 = held_bytes()
    for _ in range(400):
        session.step()
    at_500 = held_bytes()
    assert sum(not t.is_slim for t in session.traces) == 8
    # Only the attention rows of the 8 kept steps grow, with the context (108 → 508 positions).
    assert at_500 < at_100 * 508 / 108
    assert at_500 < 8 * 4 * (model.info.vocab + 2 * model.info.layers * model.info.q_heads * 520 + 4 * 64 * 3)

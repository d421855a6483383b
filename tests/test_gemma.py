"""Gemma 3's sliding-window layers in the paged cache: a local layer keeps at most its window, hands the
blocks past it back to the pool, and prefix caching and rebuilt steps stay exact.

Exactness against transformers (prefill and decode, a prompt longer than the window) is in
tests/test_exactness.py and tests/test_bf16.py, where "gemma3" is one of the families.
"""

import pytest
import torch
from transformers import AutoConfig

import engine
from engine.prefix_cache import PrefixCache
from tests.conftest import GEMMA_WINDOW
from tests.runs import decode

W = GEMMA_WINDOW


@pytest.fixture(scope="module")
def gemma(tiny_model):
    return tiny_model("gemma3")


def test_model_card_names_each_layers_kind_window_and_norms(gemma, tiny_model_dir):
    config = AutoConfig.from_pretrained(tiny_model_dir("gemma3"))
    kinds = tuple({"sliding_attention": "local", "full_attention": "global"}[t] for t in config.layer_types)
    assert gemma.info.layer_kinds == kinds and "local" in kinds and "global" in kinds
    assert gemma.info.sliding_window == config.sliding_window == W
    assert gemma.info.layer_norms == (
        "input_layernorm",
        "post_attention_layernorm",
        "pre_feedforward_layernorm",
        "post_feedforward_layernorm",
    )
    local, total = kinds.count("local"), len(kinds)
    element = gemma.info.element_bytes * 2 * gemma.info.kv_heads * gemma.info.head_dim
    assert gemma.info.kv_bytes(3 * W) == element * ((total - local) * 3 * W + local * W)
    assert gemma.info.kv_bytes(W // 2) == gemma.info.kv_bytes_per_token * (W // 2)


@pytest.mark.parametrize("block_size", [1, 4])
def test_a_local_layer_keeps_at_most_its_window_and_hands_blocks_back(gemma, block_size):
    prompt = list(range(1000, 1005))  # shorter than the window: everything it drops, decoding dropped
    generation, traces = decode(gemma, prompt, 2 * W, block_size=block_size, max_new_tokens=2 * W + 1)
    table, window, pool = generation.table, generation.table.window, generation.pool.window
    assert table.length == len(prompt) + 2 * W
    assert len(table.blocks) == -(-table.length // block_size), "a global layer keeps every position"
    held = window.length - window.first_position  # in whole blocks: one block may straddle the window's edge
    assert held <= (W if block_size == 1 else W - 1 + block_size - 1), f"the local layers hold {held} positions"
    assert window.first_position > 0, "blocks past the window were handed back"
    assert len(window.blocks) <= -(-(W - 1) // block_size) + 1
    assert pool.block_manager.used == len(window.blocks), "every block handed back is free in the window pool"
    assert len(pool.block_manager.free) == pool.num_blocks - len(window.blocks)
    used = {b for t in traces for b in t.window_block_table}
    assert len(used) < -(-table.length // block_size), "freed blocks were reused for later positions"
    assert traces[-1].window_start == window.first_position and traces[-1].window_block_table == window.blocks
    for layer in range(gemma.info.layers):  # what a view reads: the last positions of a local layer
        k, _, start = table.read(layer)
        assert start + k.shape[0] == table.length
        assert start == (window.first_position if gemma.info.window(layer) else 0)
    generation.close()
    assert pool.block_manager.used == 0 and generation.pool.block_manager.used == 0


def test_a_prompt_longer_than_the_window_is_dropped_to_it_after_the_prefill(gemma):
    generation = engine.Generation(gemma, list(range(1000, 1000 + 3 * W)), block_size=4, max_new_tokens=2)
    generation.prefill()
    window = generation.table.window
    assert window.length - window.first_position <= W + 3
    assert generation.pool.window.block_manager.used == len(window.blocks) <= -(-(W - 1) // 4) + 1


def test_rebuilt_steps_equal_the_run_while_their_window_is_held_and_after(gemma):
    generation, traces = decode(gemma, list(range(1000, 1006)), 2 * W, block_size=4, max_new_tokens=2 * W + 1)
    last = generation.rebuild(len(traces) - 1)
    assert torch.allclose(last.logits, traces[-1].logits, atol=1e-5, rtol=0)
    assert torch.equal(last.attention, traces[-1].attention) or torch.allclose(
        last.attention, traces[-1].attention, atol=1e-6, rtol=0
    )
    assert generation.table.window.first_position > traces[1].positions[0] - W + 1  # its window was handed back:
    early = generation.rebuild(1)  # rebuilt by a replay (tests/test_sliding_window.py), equal to the run's
    assert torch.equal(early.logits, traces[1].logits) and torch.equal(early.attention, traces[1].attention)


PROMPT = list(range(2000, 2007))  # within the window: its K/V are all still held when it is published


@pytest.mark.parametrize("policy", ["block", "radix", "whole"])
def test_prefix_cache_is_exact_and_reuses_only_what_the_window_layers_still_hold(gemma, policy):
    cache = PrefixCache(gemma, policy=policy, block_size=4)
    first = engine.Generation(gemma, PROMPT, prefix_cache=cache, max_new_tokens=3)
    first.prefill()
    first.close()
    longer = list(range(5000, 5000 + 3 * W))  # its first blocks left the window during its own prefill
    for prompt, reused in ((PROMPT + [42, 43, 44], 4 if policy == "block" else len(PROMPT)), (longer, 0)):
        warm = engine.Generation(gemma, prompt, prefix_cache=cache, max_new_tokens=2 * W)
        cold = engine.Generation(gemma, prompt, max_new_tokens=2 * W)
        pairs = [(warm.prefill(), cold.prefill())]
        assert pairs[0][0].prefix.reused_tokens == reused
        while not cold.finished:
            pairs.append((warm.step(), cold.step()))
        for w, c in pairs:
            assert w.token_id == c.token_id
            assert (w.logits - c.logits).abs().max().item() <= 1e-4
        warm.close()
        cold.close()
    again = engine.Generation(gemma, longer + [7], prefix_cache=cache, max_new_tokens=1)
    assert again.prefill().prefix.reused_tokens == 0, "no twin for the long prompt's first blocks: nothing reused"
    again.close()
    assert cache.pool.window.block_manager.used == len(cache.twins), "the cache alone holds the window blocks left"


def test_a_decode_steps_bytes_count_a_local_layer_up_to_its_window(gemma):
    from engine.timing import crossover_batch, crossover_context, decode_step_bytes, weight_bytes_read

    info, weights = gemma.info, weight_bytes_read(gemma.info)
    per_layer = 2 * info.kv_heads * info.head_dim * info.element_bytes
    local = info.layer_kinds.count("local")
    assert decode_step_bytes(info, 10 * W) == weights + per_layer * (local * W + (info.layers - local) * 10 * W)
    for batch in (1, 3, 40):
        context = crossover_context(info, batch)
        assert batch * info.kv_bytes(context) > weights >= batch * info.kv_bytes(context - 1), batch
    context = 4 * W
    batch = crossover_batch(info, context)
    assert batch * info.kv_bytes(context) > weights >= (batch - 1) * info.kv_bytes(context)


def test_split_kv_and_a_busy_pool_give_a_local_layer_the_same_answer(gemma):
    """Merged splits over a window (its empty splits weigh 0) and a table scattered among other requests'
    blocks change nothing."""
    from engine.busy_pool import BusyPoolReplay

    prompt = list(range(1000, 1000 + 2 * W))
    plain, traces = decode(gemma, prompt, 6, block_size=4, max_new_tokens=7)
    _, split = decode(gemma, prompt, 6, block_size=4, max_new_tokens=7, kv_splits=4)
    for a, b in zip(traces, split):
        assert a.token_id == b.token_id and (a.logits - b.logits).abs().max().item() <= 1e-5
    passes = [(prompt, list(range(len(prompt))))] + [(t.input_ids, t.positions) for t in traces[1:]]
    replay = BusyPoolReplay(gemma, passes, 4)
    assert replay.table.blocks != list(range(len(replay.table.blocks))), "the replay's table is scattered"
    for layer in range(gemma.info.layers):
        mine, theirs = replay.table.read(layer), plain.table.read(layer)
        assert mine[2] == theirs[2] and torch.allclose(mine[0], theirs[0], atol=1e-6, rtol=0)

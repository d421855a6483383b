"""Split-KV (FlashDecoding): each split's partial output, max and sum; the merge equals unsplit."""

import math

import pytest
import torch

import engine
from engine.split_kv import EXAMPLE_KEYS, EXAMPLE_QUERY, EXAMPLE_VALUES, merge, partials, split_ranges, worked_example
from tests.runs import decode


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize("length", [1, 7, 33])
def test_merged_equals_unsplit_for_random_data(dtype, tolerance, length):
    generator = torch.Generator().manual_seed(length)
    scores = torch.randn(4, 3, length, generator=generator, dtype=dtype) * 4  # (heads, queries, keys)
    values = torch.randn(4, length, 16, generator=generator, dtype=dtype)
    unsplit = torch.softmax(scores, dim=-1) @ values
    for splits in range(1, length + 3):  # beyond the number of keys: empty splits
        ranges = split_ranges(length, splits)
        assert len(ranges) == splits and ranges[0][0] == 0 and ranges[-1][1] == length
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        p = partials(scores, values, ranges)
        merged = merge(p)
        assert (merged.output - unsplit).abs().max().item() <= tolerance, splits
        assert torch.allclose(merged.weight.sum(-1), torch.ones((), dtype=dtype))
        empty = [i for i, (a, b) in enumerate(ranges) if a == b]
        for i in empty:
            assert (p.exp_sum[..., i] == 0).all() and (merged.weight[..., i] == 0).all()
            assert torch.isinf(p.max_score[..., i]).all()


def test_partials_follow_the_formulas():
    """m_i is the split's max score, l_i its sum of e^{s−m_i}, O_i its own softmax-weighted value average."""
    scores = torch.tensor([[0.5, 2.0, -1.0, 3.0, 1.0]], dtype=torch.float64)
    values = torch.arange(10, dtype=torch.float64).reshape(5, 2)
    p = partials(scores, values, [(0, 2), (2, 5)])
    assert p.max_score.tolist() == [[2.0, 3.0]]
    assert p.exp_sum[0, 0].item() == pytest.approx(math.exp(0.5 - 2) + 1, abs=1e-15)
    local = torch.softmax(scores[0, 2:], dim=-1) @ values[2:]
    assert torch.allclose(p.output[0, 1], local, atol=1e-15)


def test_worked_example_reproduces_exactly():
    ex = worked_example()
    d = len(EXAMPLE_QUERY)
    scores = [sum(q * k for q, k in zip(EXAMPLE_QUERY, key)) / math.sqrt(d) for key in EXAMPLE_KEYS]
    assert ex.scores == pytest.approx(scores, abs=1e-15)
    assert ex.ranges == [(0, 2), (2, 4)]
    # By hand, in plain Python floats: each split, then the merge, then unsplit.
    parts = []
    for a, b in ex.ranges:
        m = max(scores[a:b])
        e = [math.exp(s - m) for s in scores[a:b]]
        exp_sum = sum(e)
        o = [sum(w * v[i] for w, v in zip(e, EXAMPLE_VALUES[a:b])) / exp_sum for i in range(d)]
        parts.append((m, exp_sum, o))
    m = max(p[0] for p in parts)
    w = [exp_sum * math.exp(mi - m) for mi, exp_sum, _ in parts]
    merged = [sum(wi * p[2][i] for wi, p in zip(w, parts)) / sum(w) for i in range(d)]
    e = [math.exp(s - max(scores)) for s in scores]
    unsplit = [sum(ei * v[i] for ei, v in zip(e, EXAMPLE_VALUES)) / sum(e) for i in range(d)]
    assert ex.max_score == pytest.approx([p[0] for p in parts], abs=1e-15)
    assert ex.exp_sum == pytest.approx([p[1] for p in parts], abs=1e-15)
    assert ex.weight == pytest.approx([wi / sum(w) for wi in w], abs=1e-15)
    assert ex.merged == pytest.approx(merged, abs=1e-15)
    assert ex.unsplit == pytest.approx(unsplit, abs=1e-15)
    # the figures docs/engine-api.md quotes
    assert [f"{x:.3f}" for x in ex.merged] == [f"{x:.3f}" for x in ex.unsplit] == ["1.125", "-0.144"]


def generate(model, kv_splits, steps=20):
    return decode(model, "Split the history, not the answer:", kv_splits=kv_splits, max_new_tokens=steps)[1]


@pytest.mark.parametrize("family", ["llama", "qwen3", "gpt2"])
def test_whole_generations_through_split_kv_equal_unsplit(family, tiny_model):
    model = tiny_model(family)
    reference = generate(model, 1)
    assert all(t.split is None for t in reference)
    for splits in (2, 3, 4, 64):
        traces = generate(model, splits)
        assert [t.token_id for t in traces] == [t.token_id for t in reference]
        for ours, theirs in zip(traces, reference):
            assert (ours.logits - theirs.logits).abs().max().item() <= 1e-4
            assert len(ours.split.ranges) == splits
            assert ours.split.max_abs_diff.max().item() <= 1e-5


def test_split_trace_shapes_and_merge(tiny_model):
    model = tiny_model("llama")
    info = model.info
    generation = engine.Generation(model, "one two three four five six", kv_splits=3, max_new_tokens=5)
    generation.prefill()
    trace = generation.step()
    split = trace.split
    length = trace.context_length
    assert split.ranges == split_ranges(length, 3)
    assert split.partial.shape == (info.layers, info.q_heads, 3, info.head_dim)
    assert split.max_score.shape == split.exp_sum.shape == split.weight.shape == (info.layers, info.q_heads, 3)
    # The recorded partials merge to the recorded merged output, and unsplit is Σ a_j v_j.
    rebuilt = merge(engine.split_kv.Partials(split.max_score, split.exp_sum, split.partial))
    assert torch.allclose(rebuilt.output, split.merged, atol=1e-6)
    k, v = generation.pool.read(0, generation.table.device_blocks(), length)
    group = info.q_heads // info.kv_heads
    for head in range(info.q_heads):
        expected = trace.attention[0, head, -1] @ v[:, head // group]
        assert torch.allclose(split.unsplit[0, head], expected, atol=1e-6)


@pytest.mark.parametrize("group_elements", [1, 50, 1 << 20])  # one split per group, a few, all at once
@pytest.mark.parametrize("length, splits", [(1, 3), (7, 2), (33, 5), (33, 40), (100, 64)])
def test_online_merge_equals_merge_of_all_partials(length, splits, group_elements, monkeypatch):
    """Merged split by split (running max, rescaled sums) = `merge` of every split's partials, causal mask included."""
    monkeypatch.setattr(engine.split_kv, "SPLIT_GROUP_ELEMENTS", group_elements)
    generator = torch.Generator().manual_seed(length * splits)
    rows = 6
    scores = torch.randn(3, 2, rows, length, generator=generator, dtype=torch.float64) * 4
    positions = torch.linspace(0, length - 1, rows).round().long()
    scores = scores.masked_fill(torch.arange(length)[None, :] > positions[:, None], float("-inf"))
    values = torch.randn(3, 1, length, 8, generator=generator, dtype=torch.float64)
    merged, last = engine.split_kv.merge_online(scores, values, splits)
    everything = partials(scores, values, split_ranges(length, splits))
    assert (merged - merge(everything).output).abs().max().item() <= 1e-12
    assert (merged - torch.softmax(scores, dim=-1) @ values).abs().max().item() <= 1e-12
    assert torch.equal(last.max_score, everything.max_score[..., -1, :])
    assert torch.allclose(last.exp_sum, everything.exp_sum[..., -1, :], rtol=0, atol=1e-12)
    assert torch.allclose(last.output, everything.output[..., -1, :, :], rtol=0, atol=1e-12)

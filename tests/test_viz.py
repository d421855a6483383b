"""viz contracts: pure functions from traces to figures and tables, on a real (tiny) run."""

import numpy as np
import pytest

import engine
from engine.model import ModelInfo
from viz.attention import gqa_figure, heatmap_figure
from viz.style import window
from viz.candidates import candidates_frame
from viz.costs import context_growth_frame, steps_frame
from viz.flow import flow_rows
from viz.kv_cache import block_table_frame, kv_bytes_frame, pool_figure
from viz.prefix import alignment_frame, policy_frame
from viz.split_kv import split_frame
from viz.tokens import token_cells, token_stream_html

QWEN3_06B = ModelInfo(name="Qwen/Qwen3-0.6B", family="qwen3", layers=28, hidden=1024, q_heads=16, kv_heads=8,
                      head_dim=128, intermediate=3072, vocab=151936, tied_embeddings=True, context_limit=40960,
                      dtype="bfloat16", parameters=596_049_920, norm="RMSNorm", positions="RoPE (default)")


@pytest.fixture(scope="module")
def run(tiny_model):
    model = tiny_model("llama")
    session = engine.DecodeSession(model, "Paged blocks hold K and V", block_size=4, kv_splits=3, max_new_tokens=6,
                                   sampling=engine.Sampling(temperature=1.0, seed=2))
    traces = [session.prefill()] + [session.step() for _ in range(5)]
    return model, session, traces


def test_kv_bytes_table_has_the_design_figures_for_qwen3():
    frame = kv_bytes_frame(QWEN3_06B, 1000).set_index(["dtype", "layout"])
    assert frame.loc[("bfloat16", "GQA (as loaded)"), "bytes per token"] == 114_688  # 112 KiB
    assert frame.loc[("bfloat16", "MHA (one K/V per Q head)"), "bytes per token"] == 229_376  # 224 KiB
    assert frame.loc[("bfloat16", "GQA (as loaded)"), "bytes for 1000 tokens"] == 114_688_000


def test_flow_table_shows_concatenation_then_o_proj_for_qwen3(run):
    _, _, traces = run
    rows = {r.key: r for r in flow_rows(traces[1], QWEN3_06B)}
    assert rows["o_proj"].shape == "(1, 2048) → (1, 1024)"
    assert rows["embed"].facts == {"vocab": 151936, "hidden": 1024}
    assert rows["sample"].facts == {"id": traces[1].token_id}


def test_token_cells_and_stream_escape_text(run, tokenizer):
    _, session, _ = run
    cells = token_cells(tokenizer, tokenizer.encode("<b>x</b> 你"), session.generated[:2])
    html = token_stream_html(cells)
    body = html.split("</style>")[1]
    assert "<b>" not in body and "</b>" not in body and "&lt;" in body
    assert [c.kind for c in cells[-3:]] == ["prompt", "generated", "newest"]
    assert any(c.text.startswith("⟨") for c in cells)  # a partial character shown as its bytes


def test_heatmap_blanks_the_causal_future():
    matrix = np.tril(np.full((5, 5), 0.2))
    z = np.array(heatmap_figure(matrix, list("abcde")).data[0].z, dtype=float)
    assert np.isnan(z[np.triu_indices(5, 1)]).all() and not np.isnan(z[np.tril_indices(5)]).any()
    assert window(1000) == slice(840, 1000) and window(10) == slice(0, 10)


def test_gqa_figure_links_each_q_head_to_its_kv_head():
    fig = gqa_figure(16, 8)
    lines = [t for t in fig.data if t.mode == "lines"]
    assert len(lines) == 16
    assert {round(t.y[1], 1) for t in lines[:2]} == {0.5}  # Q0 and Q1 meet at KV0


def test_pool_figure_puts_each_position_in_its_block_and_slot(run):
    model, session, traces = run
    trace = traces[-1]
    labels = [str(i) for i in range(trace.context_length)]
    fig = pool_figure(trace.block_table, trace.context_length, 4, session.pool.num_blocks, labels)
    text = fig.data[0].text
    for position in range(trace.context_length):
        block = trace.block_table[position // 4]
        assert text[block][position % 4] == f"{position}:{position}"
    frame = block_table_frame(trace.block_table, trace.context_length, 4, labels)
    assert list(frame["physical"]) == trace.block_table


def test_candidates_split_costs_and_prefix_tables(run):
    model, _, traces = run
    frame = candidates_frame(traces[2])
    assert frame["drawn"].sum() == 1 and frame.loc[frame["drawn"], "id"].item() == traces[2].token_id
    split = split_frame(traces[3].split, layer=1, head=0)
    assert list(split["count"]) == [end - start for start, end in traces[3].split.ranges]
    assert abs(split["weight w_i/Σw"].sum() - 1) < 1e-6
    costs = steps_frame(traces, model.info)
    assert list(costs["phase"]) == ["prefill"] + ["decode"] * 5
    assert list(costs["K/V bytes read"]) == [t.context_length * model.info.kv_bytes_per_token for t in traces]
    growth = context_growth_frame(model.info, [10, 20])
    assert growth["KV cache MiB"][1] == 2 * growth["KV cache MiB"][0]
    assert growth["attention scores (millions)"][1] / growth["attention scores (millions)"][0] == pytest.approx(210 / 55)
    align = alignment_frame([1, 2, 3], [1, 2, 4, 5], list("abc"), list("abde"), reused=2)
    assert list(align["same id"]) == [True, True, False, False] and list(align["reused"]) == [True, True, False, False]
    assert list(policy_frame({"block": 0, "radix": 9}, 17)["computed tokens"]) == [17, 8]


def test_figure_labels_follow_the_language():
    from ui.strings import translate_figure
    from viz.kv_cache import occupancy_bar

    fig = translate_figure(occupancy_bar(3, 2, 10), "zh")
    assert [t.name for t in fig.data] == ["使用中", "已缓存、空闲", "空闲"]
    assert [t.name for t in translate_figure(occupancy_bar(3, 2, 10), "en").data] == ["in use", "cached, free", "empty"]

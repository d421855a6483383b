"""viz contracts: pure functions from traces to figures and tables, on a real (tiny) run."""

import re
from dataclasses import replace

import numpy as np
import pytest
from plotly.colors import sample_colorscale

import engine
from engine.model_info import ModelInfo
from engine.tokens import token_cells
from tests.runs import decode
from ui.text.strings import figure_words
from viz.attention import focused_head, gqa_figure, head_grid_figure, heatmap_figure
from viz.candidates import candidates_frame, candidates_table
from viz.costs import context_growth_frame, steps_frame, steps_table
from viz.flow import flow_rows, residual_figure, vector_figure
from viz.kv_bytes import kv_bytes_frame, kv_bytes_table
from viz.kv_cache import block_table_frame, pool_figure
from viz.prefix import alignment_frame, policies_figure, policy_frame, policy_table
from viz.split_kv import split_frame, split_table
from viz.style import OKABE_ITO, contrast_ratio, window
from viz.tokens import token_stream_html
from viz.words import ENGLISH

QWEN3_06B = ModelInfo(
    name="Qwen/Qwen3-0.6B",
    family="qwen3",
    layers=28,
    hidden=1024,
    q_heads=16,
    kv_heads=8,
    head_dim=128,
    intermediate=3072,
    vocab=151936,
    tied_embeddings=True,
    context_limit=40960,
    dtype="bfloat16",
    parameters=596_049_920,
    norm="RMSNorm",
    positions="RoPE (default)",
)


@pytest.fixture(scope="module")
def run(tiny_model):
    model = tiny_model("llama")
    session, traces = decode(
        model,
        "Paged blocks hold K and V",
        5,
        block_size=4,
        kv_splits=3,
        max_new_tokens=6,
        sampling=engine.Sampling(temperature=1.0, seed=2),
    )
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
    assert list(frame[ENGLISH["bt_physical"]]) == trace.block_table


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
    assert growth["attention scores (millions)"][1] / growth["attention scores (millions)"][0] == pytest.approx(
        210 / 55
    )
    align = alignment_frame([1, 2, 3], [1, 2, 4, 5], list("abc"), list("abde"), reused=2)
    assert list(align["same id"]) == [True, True, False, False] and list(align["reused"]) == [True, True, False, False]
    assert list(policy_frame({"block": 0, "radix": 9}, 17)["computed tokens"]) == [17, 8]


def test_figures_take_their_words_from_the_page():
    from ui.text.strings import figure_words
    from viz.kv_cache import occupancy_bar

    zh = occupancy_bar(3, 2, 10, words=figure_words("zh"))
    assert [t.name for t in zh.data] == ["使用中", "已缓存、空闲", "空闲"]
    assert [t.name for t in occupancy_bar(3, 2, 10).data] == ["in use", "cached, free", "empty"]


def test_every_figure_word_has_a_chinese_translation():
    from viz.words import TRANSLATIONS

    ZH_FIGURE_WORDS = TRANSLATIONS["zh"]
    assert all(text.strip() for text in ZH_FIGURE_WORDS.values())  # an empty cell in the CSV is a missing word
    for key, text in ENGLISH.items():  # the same placeholders, so a format never fails in one language only
        assert set(re.findall(r"(?<!{){(\w+)}", text)) == set(re.findall(r"(?<!{){(\w+)}", ZH_FIGURE_WORDS[key])), key


# -- charts that read at a glance (issue 10) ---------------------------------------------------------


def test_residual_axis_label_uses_characters_every_font_has(run):
    _, _, traces = run
    for words in (ENGLISH, figure_words("zh")):
        title = residual_figure(traces[1].residual.numpy(), words=words).layout.yaxis.title.text
        assert "‖" not in title and "|x|" in title  # "‖" draws as a box in many fonts


def test_vector_strips_each_get_their_own_symmetric_colour_scale():
    rng = np.random.default_rng(0)
    big, small = rng.uniform(-40, 40, 64), rng.uniform(-0.05, 0.05, 64)
    fig = vector_figure({"final": big, "embedding": small})
    heatmaps = [t for t in fig.data if t.type == "heatmap"]
    assert len(heatmaps) == 2
    for trace, values in zip(heatmaps, (big, small)):
        assert trace.zmax == pytest.approx(np.abs(values).max()) and trace.zmin == pytest.approx(-np.abs(values).max())
        assert np.allclose(np.asarray(trace.z, dtype=float).ravel(), values)  # hover shows the true values


def test_all_heads_chart_gives_each_kv_head_its_own_colour_as_in_the_gqa_diagram():
    q_heads, kv_heads = 16, 4
    group = q_heads // kv_heads
    rows = np.full((q_heads, 12), 1 / 12)
    grid = head_grid_figure(rows, [str(i) for i in range(12)], group)
    colours = [t.marker.color for t in grid.data]
    for kv in range(kv_heads):
        assert len(set(colours[kv * group : (kv + 1) * group])) == 1  # the Q heads sharing a KV head match
    per_kv = [colours[kv * group] for kv in range(kv_heads)]
    assert len(set(per_kv)) == kv_heads  # KV0 and KV2 are no longer both blue
    assert set(per_kv) <= set(OKABE_ITO.values())  # colour-blind-safe palette
    gqa = gqa_figure(q_heads, kv_heads)
    kv_markers = next(t for t in gqa.data if t.text is not None and t.text[0].startswith("K/V"))
    assert list(kv_markers.marker.color) == per_kv
    lines = [t for t in gqa.data if t.mode == "lines"]
    assert [line.line.color for line in lines] == colours


def test_all_heads_chart_y_axis_fits_the_data_so_diffuse_rows_are_not_flat():
    rows = np.full((4, 20), 0.05)
    rows[2, 3] = 0.12
    top = head_grid_figure(rows, [str(i) for i in range(20)], 2).layout.yaxis.range[1]
    assert 0.12 <= top <= 0.15  # not 1: a bar of 0.05 now fills a third of the panel
    axes = [head_grid_figure(rows, [str(i) for i in range(20)], 2).layout[f"yaxis{i}"] for i in ("", 2, 3, 4)]
    assert len({tuple(a.range) for a in axes}) == 1  # one scale: the heads compare


def test_focused_head_prefers_a_sharp_mid_layer_head_over_sinks_and_early_layers():
    layers, heads, length = 8, 4, 10
    rows = np.full((layers, heads, length), 1 / length)
    rows[0, 0] = np.eye(length)[5]  # sharp, but in the first quarter of the layers
    rows[3, 1] = np.eye(length)[0]  # everything on position 0: a sink, nothing to see
    rows[4, 3] = np.eye(length)[-1]  # everything on the query's own position: not a look into the cache
    rows[5, 2] = 0.02
    rows[5, 2, 6] = 1 - 0.02 * (length - 1)  # a clear focus on one earlier token
    assert focused_head(rows) == (5, 2)
    assert focused_head(np.full((2, 4, 2), 0.5)) == (0, 0)  # too short to have a pattern


def test_block_slot_labels_are_large_and_contrast_with_their_cell(run):
    _, session, traces = run
    trace = traces[-1]
    labels = [str(i) for i in range(trace.context_length)]
    fig = pool_figure(trace.block_table, trace.context_length, 4, session.pool.num_blocks, labels)
    heat, text = fig.data[0], fig.data[1]
    assert text.mode == "text" and text.textfont.size >= 12
    assert len(text.text) == trace.context_length
    z = np.asarray(heat.z, dtype=float)
    for x, y, colour in zip(text.x, text.y, text.textfont.color):
        scale = [list(stop) for stop in heat.colorscale]
        cell = sample_colorscale(scale, [(z[y, x] - heat.zmin) / (heat.zmax - heat.zmin)])[0]
        assert contrast_ratio(cell, colour) >= 4.5, (x, y, cell, colour)


def test_candidates_table_shows_the_drawn_mark_first_and_percentages(run):
    _, _, traces = run
    trace = traces[2]
    table = candidates_table(trace)
    assert list(table.columns[:2]) == ["drawn", "token"]  # the mark can no longer be cut off at the right
    assert list(table["drawn"]).count("✓") == 1
    drawn = table[table["drawn"] == "✓"]
    assert int(drawn["id"].item()) == trace.token_id
    for candidate, cell in zip(trace.candidates, table["softmax"]):
        assert re.fullmatch(r"\d{1,3}\.\d{1,2}%", cell) and float(cell[:-1]) == pytest.approx(
            100 * candidate.p_raw, abs=0.01
        )
    # a stage column only where that stage changed a probability: a filter that is off repeats the one before
    same = [
        all(getattr(c, a) == getattr(c, b) for c in trace.candidates)
        for a, b in (("p_raw", "p_temperature"), ("p_temperature", "p_top_k"), ("p_top_k", "p_top_p"))
    ]
    shown = [n for n, repeated in zip(("÷ temperature", "after top-k", "after top-p"), same) if not repeated]
    assert list(table.columns) == ["drawn", "token", "id", "softmax", *shown]
    filtered = replace(trace, candidates=[replace(c, p_top_k=c.p_top_k / 2) for c in trace.candidates])
    zh = candidates_table(filtered, figure_words("zh"))
    assert "p_top_k" not in zh.columns and "top-k 后" in zh.columns


def test_download_labels_are_short_enough_for_their_buttons():
    from ui.text import strings

    for lang in ("en", "zh"):
        for key in ("download_trace", "download_tokens"):
            assert len(strings.t(key, lang)) <= 14, (lang, strings.t(key, lang))


def test_tables_format_numbers_for_people(run):
    model, _, traces = run
    kv = kv_bytes_table(QWEN3_06B, 1000).set_index(["dtype", "layout"])
    assert kv.loc[("bfloat16", "GQA (as loaded)"), "bytes per token"] == "114,688 B (112 KiB)"
    assert kv.loc[("bfloat16", "GQA (as loaded)"), "bytes for 1,000 tokens"] == "114,688,000 B (109.4 MiB)"
    steps = steps_table(steps_frame(traces, model.info))
    for cell in list(steps["forward"]) + list(steps["total"]):
        assert re.fullmatch(r"[\d,]+(\.\d{1,2})? ms", cell), cell  # not 0.1234 without a unit
    big = steps_table(steps_frame(traces, QWEN3_06B))["K/V bytes read"]
    assert big[0] == f"{traces[0].context_length * 114_688:,} B ({traces[0].context_length * 112} KiB)"
    split = split_table(traces[3].split, layer=1, head=0)
    assert all(re.fullmatch(r"\d{1,3}\.\d{1,2}%", w) for w in split["weight w_i/Σw"])
    assert all(re.fullmatch(r"-?[\d,]+\.\d{3}|–", m) for m in split["m_i (max score)"])
    policies = policy_table(policy_frame({"block": 1024, "radix": 1030}, 1100))
    assert list(policies["reused tokens"]) == ["1,024", "1,030"]


def test_policies_side_by_side_show_each_block_or_token_as_hit_or_miss():
    from engine.prefix_cache import PromptHistory
    from viz.style import HIT_COLOR, MISS_COLOR

    history = PromptHistory()
    history.add(cached := list(range(1, 12)))
    reuse = history.predicted_reuse(cached[:9] + [60, 61, 62], 4)  # 12 tokens, first differing at 9
    zh = figure_words("zh")
    fig = policies_figure({p: reuse[p] for p in ("whole", "block", "radix")}, 4, words=zh)
    rows = {bar.y[0]: bar for bar in fig.data}
    assert list(rows) == [zh["policy_whole"], zh["policy_block"], zh["policy_radix"]]
    block, radix, whole = rows[zh["policy_block"]], rows[zh["policy_radix"]], rows[zh["policy_whole"]]
    assert list(block.base) == [0, 4, 8] and list(block.x) == [4, 4, 4]  # whole blocks on the positions axis
    assert list(block.marker.color) == [HIT_COLOR, HIT_COLOR, MISS_COLOR]
    assert list(radix.text) == ["命中"] * 9 + ["未命中"] * 3
    assert set(whole.text) == {"未命中"}


def ticks(axis, count: int) -> int:
    """How many ticks Plotly lays out on `axis` over `count` positions."""
    return -(-count // (axis.dtick or 1))


def test_the_limits_worst_case_draws_bounded_figures_that_still_place_every_position():
    """Block size 1 on a 382-token prompt with 128 steps (the limits' worst case): every position keeps its block
    and colour, but the axes carry at most MOST_TICKS ticks and the charts write on no cell too small to read (the
    browser spent seconds laying out 512 ticks or 1,146 labelled bars)."""
    from engine.prefix_cache import PromptHistory
    from viz.kv_cache import busy_pool_figure
    from viz.style import HIT_COLOR, MOST_TICKS

    length, prompt = 382 + 128, 382
    table = [2 * i + 1 for i in range(length)]  # scattered: every second block
    fig = pool_figure(table, length, 1, 2 * length + 4, [str(i) for i in range(length)])
    assert len(fig.data) == 1  # no slot labels: the hover names each slot
    z = fig.data[0].z
    assert all(z[table[p]][0] == p for p in range(length))
    assert ticks(fig.layout.yaxis, len(z)) <= MOST_TICKS and fig.layout.xaxis.dtick == 1

    others = {2 * i: i + 1 for i in range(prompt)}
    fig = busy_pool_figure(table, length, 1, others, 2 * length + 4)
    mine = fig.data[1].z
    assert all(mine[0][table[p]] == p for p in range(length)) and not fig.layout.annotations
    assert ticks(fig.layout.xaxis, len(mine[0])) <= MOST_TICKS

    history = PromptHistory()
    history.add(cached := list(range(1, prompt + 1)))
    new = cached[:300] + [9000 + i for i in range(prompt - 300)]
    reuse = history.predicted_reuse(new, 1)
    fig = policies_figure(reuse, 1)
    for bar, result in zip(fig.data, reuse.values()):
        hit_at = [False] * prompt
        for start, width, color in zip(bar.base, bar.x, bar.marker.color):
            hit_at[start : start + width] = [color == HIT_COLOR] * width
        assert hit_at == result.hits and len(bar.x) <= 3  # the same hits, in runs
    assert ticks(fig.layout.xaxis, prompt) <= MOST_TICKS


def test_a_figure_without_its_title_keeps_its_plot_size(run):
    """The page writes a figure's title as text (it wraps) and draws the figure without it: the title's room goes
    from the top margin and the height, and the plot area keeps its size."""
    from viz.flow import residual_figure
    from viz.step_picture import step_figure
    from viz.style import untitled

    model, _, traces = run
    for large in (False, True):
        for fig in (
            residual_figure(traces[1].residual.numpy(), "A title", large),
            step_figure(traces[1], model.info, title="A title", large=large),
        ):
            plot = lambda f: f.layout.height - f.layout.margin.t - f.layout.margin.b  # noqa: E731
            titled_plot, titled_top = plot(fig), fig.layout.margin.t
            assert fig.layout.title.text == "A title"
            bare = untitled(fig)
            assert not bare.layout.title.text and plot(bare) == titled_plot and bare.layout.margin.t < titled_top

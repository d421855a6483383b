"""The views on a tiny random Gemma 3 model whose window (GEMMA_WINDOW) is shorter than the prompt: the attention
view marks local and global layers and draws the window, the KV view shows each layer's cached length and the
bytes the windows save, numbers worked out here by hand from the config."""

import base64
import json

import numpy as np
import pytest
from transformers import AutoConfig, AutoTokenizer

from tests.app_helpers import assert_clean, start
from tests.conftest import GEMMA_WINDOW
from viz.style import fmt_size

PROMPT = "Paged attention keeps the whole history of a sequence in blocks of the cache"
STEP = 3


@pytest.fixture
def gemma_page(monkeypatch, tiny_model_dir):
    folder = tiny_model_dir("gemma3")
    monkeypatch.setenv("KVSCOPE_MODELS", folder)
    return folder


def charts(at):
    return [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]


def matrix(z) -> np.ndarray:
    """A heatmap's z as drawn: Plotly's JSON writes a typed array as base64 with its dtype and shape."""
    if isinstance(z, dict):
        shape = [int(d) for d in str(z.get("shape", "-1")).split(",")]
        return np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"]).reshape(shape)
    return np.array(z, dtype=float)


def markdown(at) -> str:
    """The page's Markdown and captions, read as text (values are escaped to show as text: "10\\.2" is 10.2)."""
    source = "\n".join(m.value for m in at.markdown) + "\n" + "\n".join(c.value for c in at.caption)
    return source.replace("\\", "")


def test_the_attention_view_marks_local_and_global_layers_and_draws_the_window(gemma_page):
    kinds = AutoConfig.from_pretrained(gemma_page).layer_types
    local, global_ = kinds.index("sliding_attention"), kinds.index("full_attention")
    at = start(model=gemma_page, prompt=PROMPT, chat=0, step=STEP, view="attention", layer=local, head=0)
    assert_clean(at)
    text = markdown(at)
    assert f"Layer {local} is local" in text and f"the last {GEMMA_WINDOW} positions" in text
    heatmap = charts(at)[0]
    assert heatmap["data"][0]["type"] == "heatmap"
    edges = [s for s in heatmap["layout"].get("shapes", []) if s.get("type") == "path"]
    assert len(edges) == 1  # the window's edge
    last = matrix(heatmap["data"][0]["z"])[-1]  # the newest query: only its last GEMMA_WINDOW keys are drawn
    assert np.isnan(last[:-GEMMA_WINDOW]).all() and not np.isnan(last[-GEMMA_WINDOW:]).any()
    at = start(model=gemma_page, prompt=PROMPT, chat=0, step=STEP, view="attention", layer=global_, head=0)
    assert_clean(at)
    assert f"Layer {global_} is global" in markdown(at)
    heatmap = charts(at)[0]
    assert not [s for s in heatmap["layout"].get("shapes", []) if s.get("type") == "path"]
    assert not np.isnan(matrix(heatmap["data"][0]["z"])[-1]).any()  # a global layer's newest row reads every key


def test_the_kv_view_shows_each_layers_cached_length_and_the_bytes_saved(gemma_page):
    config = AutoConfig.from_pretrained(gemma_page)
    n = len(AutoTokenizer.from_pretrained(gemma_page)(PROMPT)["input_ids"]) + STEP - 1  # cached at this step
    assert n > GEMMA_WINDOW
    block = 4
    at = start(model=gemma_page, prompt=PROMPT, chat=0, step=STEP, view="kv", layer=0, head=0, block_size=block)
    assert_clean(at)
    kinds = ("local (sliding window)", "global (all positions)")  # the bars' names: one trace per kind

    def bars(at):
        lengths = next(c for c in charts(at) if {t.get("name") for t in c["data"]} == set(kinds))
        return {int(x): int(y) for trace in lengths["data"] for x, y in zip(matrix(trace["x"]), matrix(trace["y"]))}

    def kept_by_hand(length):  # a local layer keeps at most its window, a global one everything
        return {
            i: min(length, GEMMA_WINDOW) if kind == "sliding_attention" else length
            for i, kind in enumerate(config.layer_types)
        }

    shown = 4 * GEMMA_WINDOW  # the picture opens four windows long, past where the window slid
    assert bars(at) == kept_by_hand(shown)
    per_position = 4 * 2 * config.num_key_value_heads * config.head_dim  # float32 K and V of one position, one layer
    every = per_position * shown * config.num_hidden_layers
    kept = per_position * sum(kept_by_hand(shown).values())
    text = markdown(at)
    size = fmt_size  # bytes as the page writes them (the numbers are this test's own)
    assert f"all {shown} positions would take {size(every)}" in text and f"its K/V take {size(kept)}" in text
    assert f"{size(every - kept)} saved" in text
    at.slider(key="v_lengths_at").set_value(n).run()  # the run's own length
    assert_clean(at)
    assert bars(at) == kept_by_hand(n)
    text = markdown(at)
    assert f"reading the last {GEMMA_WINDOW} cached positions in each local layer and all {n} in each global" in text
    first = (n - GEMMA_WINDOW) // block * block  # layer 0 is local: its window, in whole blocks
    assert f"holds positions {first}–{n - 1}" in text


def test_the_model_card_carries_the_gemma_licence_notice_for_a_gemma_model_only(
    gemma_page, monkeypatch, tiny_model_dir
):
    notice = "Gemma is provided under and subject to the Gemma Terms of Use"
    at = start(model=gemma_page, prompt=PROMPT, step=1)
    assert_clean(at)
    assert notice in markdown(at)
    llama = tiny_model_dir("llama")
    monkeypatch.setenv("KVSCOPE_MODELS", llama)
    at = start(model=llama, prompt=PROMPT, chat=0, step=1)
    assert_clean(at)
    assert notice not in markdown(at)

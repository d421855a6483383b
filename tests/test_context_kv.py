"""One token in two contexts (engine.context_kv) against transformers on the same weights: the K and V its cache
holds in every layer equal transformers' cache; at layer 0 the key before rotation (transformers' k_proj, after
k_norm where the model has one) and the value are the same in both contexts, and after rotation the keys differ by
the turn of their positions only; from layer 1 on they differ in content."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.context_kv import token_in_contexts
from engine.errors import InvalidSettingError
from tests.helpers import hf_keys_before_rotation

FIRST = "Yesterday I went to the market and I ate an apple"
SECOND = "An apple"
ATOL = 1e-5


def hf_keys(folder: str, ids: list[int]):
    """transformers' cached keys and values (layers, kv_heads, n, D) and layer 0's keys before rotation
    (n, kv_heads, D), from a hook on k_norm (or k_proj where there is none)."""
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    cache, unrotated = hf_keys_before_rotation(hf, ids)
    before = unrotated[0].reshape(len(ids), hf.config.num_key_value_heads, -1)
    return ([layer.keys[0] for layer in cache.layers], [layer.values[0] for layer in cache.layers], before)


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3", "llama3-rope"])
def test_a_token_in_two_contexts_equals_transformers_and_differs_only_after_layer_0(family, tiny_model, tiny_model_dir):
    model = tiny_model(family)
    first = model.tokenizer(FIRST, add_special_tokens=False)["input_ids"]
    second = model.tokenizer(SECOND, add_special_tokens=False)["input_ids"]
    i, j = len(first) - 1, len(second) - 1
    assert first[i] == second[j] and i != j  # " apple", at two positions
    both = token_in_contexts(model, first, i, second, j)
    for ids, index, side in ((first, i, 0), (second, j, 1)):
        keys, values, before = hf_keys(tiny_model_dir(family), ids)
        last = index - len(ids)  # the token ends its context: from the end (a sliding layer keeps only its window)
        for layer in range(model.info.layers):
            torch.testing.assert_close(both.keys[side][layer], keys[layer][:, last], atol=ATOL, rtol=0)
            torch.testing.assert_close(both.values[side][layer], values[layer][:, last], atol=ATOL, rtol=0)
        torch.testing.assert_close(both.unrotated_keys[side][0], before[index], atol=ATOL, rtol=0)
    assert both.largest_difference("unrotated_keys", 0) < ATOL  # layer 0: the same key before rotation
    assert both.largest_difference("values", 0) < ATOL  # and the same value
    assert both.largest_difference("keys", 0) > 1e-3  # turned by two different positions
    unrotated, values = both.unrotated_key_cosines(), both.value_cosines()
    assert all(c < 1 - 1e-6 for c in unrotated[1:]) and all(c < 1 - 1e-6 for c in values[1:])


def test_a_model_with_learned_positions_has_no_unrotated_keys_and_differs_at_layer_0(tiny_model):
    """GPT-2 adds a position's row to the embedding: at layer 0 x_i already depends on where the token is."""
    model = tiny_model("gpt2")
    first = model.tokenizer(FIRST, add_special_tokens=False)["input_ids"]
    second = model.tokenizer(SECOND, add_special_tokens=False)["input_ids"]
    both = token_in_contexts(model, first, len(first) - 1, second, len(second) - 1)
    assert both.unrotated_keys is None and both.largest_difference("values", 0) > 1e-3


def test_different_ids_or_an_index_outside_raise_a_clear_error(tiny_model):
    model = tiny_model("llama")
    ids = model.tokenizer(FIRST, add_special_tokens=False)["input_ids"]
    with pytest.raises(InvalidSettingError, match="different ids"):
        token_in_contexts(model, ids, 0, ids, 1)
    with pytest.raises(InvalidSettingError, match="outside"):
        token_in_contexts(model, ids, len(ids), ids, 0)


@pytest.mark.browser
def test_the_kv_views_two_contexts_open_on_a_click_in_a_browser(server, page):
    """Outside the lesson the part waits closed under the KV view (a press there builds nothing more); a click opens
    it: the chart and the sentence naming the token and its two positions."""
    from playwright.sync_api import expect

    from tests.helpers import WAIT_MS, idle, widget

    page.goto(f"{server}/?view=kv&step=2")
    idle(page)
    part = widget(page, "x_contexts")
    expect(part.locator("[data-testid='stPlotlyChart']")).to_have_count(0)
    part.locator("summary").first.click()
    expect(part.locator("[data-testid='stPlotlyChart']")).to_be_visible(timeout=WAIT_MS)
    expect(part).to_contain_text("token 11977", timeout=WAIT_MS)  # " apple" in both sentences, on SmolLM2
    expect(part).to_contain_text("position 3")


def test_every_page_on_a_model_reads_one_computation_of_the_two_contexts(tiny_model):
    """The pair's K/V are the model's, not a page's: pages sharing the server's run store compute them once."""
    from ui.runs.runner import Runner
    from ui.runs.store import RunStore

    model, store = tiny_model("llama"), RunStore(10**9)
    first, second = (Runner(model, cache_tokens=64, store=store) for _ in range(2))
    both = first.token_in_contexts(FIRST, SECOND, "apple")
    assert second.token_in_contexts(FIRST, SECOND, "apple") is both and store.built == 1

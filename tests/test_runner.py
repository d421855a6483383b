"""The app's per-session run, without Streamlit."""

import torch

import engine
from ui.runner import Runner, RunConfig


def config(prompt="Rows grow one step at a time", **changes):
    values = dict(prompt=prompt, chat=False, sampling=engine.Sampling(temperature=1.0, seed=4), block_size=4,
                  kv_splits=1, policy="radix", max_new_tokens=40, max_prompt_tokens=200)
    return RunConfig(**{**values, **changes})


def test_heatmap_grown_from_decode_rows_equals_a_fresh_computation(tiny_model, monkeypatch):
    model = tiny_model("llama")
    runner = Runner(model, cache_tokens=256, keep_full_traces=8)
    prefills = []
    original = model.full_attention
    monkeypatch.setattr(model, "full_attention", lambda *a, **k: prefills.append(a) or original(*a, **k))
    runner.configure(config())
    runner.advance_to(2)
    runner.full_attention(2, layer=1, head=3)  # computed once by a prefill
    for step in range(3, 12):
        runner.advance_to(step)
        grown = runner.full_attention(step, layer=1, head=3)  # grown by one recorded row
        n = len(runner.prompt_ids) + step - 1
        fresh = original((runner.prompt_ids + runner.session.generated)[:n], 1, 4)
        assert grown[0].shape == (n, n)
        torch.testing.assert_close(grown[0], fresh[0][3], atol=1e-6, rtol=0)
        torch.testing.assert_close(grown[1], fresh[1][3], atol=1e-5, rtol=0)
    assert len(prefills) == 1  # every later step added a row instead of recomputing
    back = runner.full_attention(5, layer=1, head=3)  # stepping back slices what is there
    assert back[0].shape == (len(runner.prompt_ids) + 4,) * 2


def test_a_new_prompt_publishes_the_old_one(tiny_model):
    runner = Runner(tiny_model("llama"), cache_tokens=256)
    runner.configure(config("first prompt here"))
    runner.advance_to(1)
    runner.configure(config("first prompt here, extended"))
    assert runner.history == [runner.model.tokenizer.encode("first prompt here")]
    assert runner.policy_reuse()["radix"] > 0

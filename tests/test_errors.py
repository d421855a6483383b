"""Bad input raises a clear, documented exception (never a bare traceback from deep inside)."""

import json

import pytest

import engine
from tests.conftest import CONTEXT


@pytest.mark.parametrize("prompt", ["", "   ", "\n\t  \n", []])
def test_empty_or_whitespace_prompt(prompt, tiny_model):
    with pytest.raises(engine.EmptyPromptError, match="empty|no token ids"):
        engine.Generation(tiny_model("llama"), prompt)


def test_prompt_longer_than_the_context_limit(tiny_model):
    model = tiny_model("llama")
    with pytest.raises(engine.PromptTooLongError, match=f"at most {CONTEXT - 1} tokens"):
        engine.Generation(model, [5] * CONTEXT)
    engine.Generation(model, [5] * (CONTEXT - 1))  # one position left for the answer: allowed


def test_generation_stops_at_the_context_limit(tiny_model):
    generation = engine.Generation(tiny_model("gpt2"), [7] * (CONTEXT - 4), max_new_tokens=100)
    generation.prefill()
    while not generation.finished:
        generation.step()
    assert generation.stop_reason == "context_limit"
    assert len(generation.ids) == CONTEXT


def test_token_ids_out_of_range(tiny_model):
    with pytest.raises(engine.InvalidSettingError, match="token ids"):
        engine.Generation(tiny_model("llama"), [1, 2, 10**9])


@pytest.mark.parametrize("spec", ["/no/such/folder", "nobody-here/no-such-model-xyz", "../../etc", "not a model", ""])
def test_unknown_model_id_or_folder(spec):
    with pytest.raises(engine.ModelNotFoundError):
        engine.load_model(spec)


def test_folder_without_a_config(tmp_path):
    with pytest.raises(engine.ModelNotFoundError, match="config.json"):
        engine.load_model(str(tmp_path))


def test_unsupported_architecture(tmp_path):
    from transformers import GPTNeoXConfig

    GPTNeoXConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64).save_pretrained(
        tmp_path
    )
    with pytest.raises(engine.UnsupportedModelError, match="llama, qwen2, qwen3, gpt2"):
        engine.load_model(str(tmp_path))


@pytest.mark.parametrize(
    "family, changes, match",
    [
        ("qwen2", {"use_sliding_window": True, "sliding_window": 8}, "sliding-window attention"),
        ("gemma3", {"attn_logit_softcapping": 50.0}, "caps its attention scores"),
        ("gemma3", {"use_bidirectional_attention": True}, "bidirectional attention"),
        ("gpt2", {"add_cross_attention": True}, "cross-attention"),
    ],
    ids=["qwen2-sliding-window", "gemma3-softcapping", "gemma3-bidirectional", "gpt2-cross-attention"],
)
def test_a_feature_the_engine_does_not_compute_is_refused_not_computed_wrongly(tmp_path, family, changes, match):
    """A supported family with a feature the engine leaves out (engine/loader.py `_check_supported`) is refused
    with its name, before any weight is read."""
    from tests.conftest import family_config

    config = family_config(family, vocab=64)
    for name, value in changes.items():
        setattr(config, name, value)
    config.save_pretrained(tmp_path)
    with pytest.raises(engine.UnsupportedModelError, match=match):
        engine.load_model(str(tmp_path))


def test_architecture_transformers_does_not_know(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "not-a-real-family"}))
    with pytest.raises(engine.UnsupportedModelError, match="supported"):
        engine.load_model(str(tmp_path))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": -0.2}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"seed": -1}, "seed"),
        ({"temperature": 1e-38}, "at least 0.01"),  # would overflow float32 logits: NaN probabilities
        ({"temperature": 1e-45}, "at least 0.01"),
        ({"temperature": 0.0099}, "at least 0.01"),
        ({"seed": 2**70}, r"seed must be an integer in \[0, 4294967295\]"),  # was a bare ValueError from torch
        ({"seed": 2**32}, "seed"),
    ],
)
def test_bad_sampling_settings(kwargs, match):
    with pytest.raises(engine.InvalidSettingError, match=match):
        engine.Sampling(**kwargs)


@pytest.mark.parametrize("block_size", [0, -3, 1.5, True])
def test_bad_block_size(block_size, tiny_model):
    with pytest.raises(engine.InvalidSettingError, match="block_size"):
        engine.Generation(tiny_model("llama"), "hello", block_size=block_size)


def test_steps_out_of_order(tiny_model):
    generation = engine.Generation(tiny_model("llama"), "hello", max_new_tokens=1)
    with pytest.raises(engine.GenerationStateError, match="prefill"):
        generation.step()
    generation.prefill()
    with pytest.raises(engine.GenerationStateError, match="ended"):
        generation.step()
    generation.close()
    with pytest.raises(engine.GenerationStateError, match="closed"):
        generation.prefill()


def test_every_error_is_a_kvscope_error():
    for cls in (
        engine.EmptyPromptError,
        engine.PromptTooLongError,
        engine.ModelNotFoundError,
        engine.UnsupportedModelError,
        engine.InvalidSettingError,
        engine.GenerationStateError,
    ):
        assert issubclass(cls, engine.KvscopeError)


@pytest.mark.parametrize("keep_full_traces", [0, -1, 1.5, True])
def test_bad_keep_full_traces(keep_full_traces, tiny_model):
    with pytest.raises(engine.InvalidSettingError, match="keep_full_traces"):
        engine.Generation(tiny_model("llama"), "hello", keep_full_traces=keep_full_traces)


@pytest.mark.parametrize("max_new_tokens", [0, -2, 3.0, False, "8"])
def test_bad_max_new_tokens(max_new_tokens, tiny_model):
    with pytest.raises(engine.InvalidSettingError, match="max_new_tokens must be an integer ≥ 1"):
        engine.Generation(tiny_model("llama"), "hello", max_new_tokens=max_new_tokens)


@pytest.mark.parametrize("kv_splits", [0, -1, 2.0, True])
def test_bad_kv_splits(kv_splits, tiny_model):
    with pytest.raises(engine.InvalidSettingError, match="kv_splits"):
        engine.Generation(tiny_model("llama"), "hello", kv_splits=kv_splits)


def test_bad_prefix_cache_settings(tiny_model):
    model = tiny_model("llama")
    with pytest.raises(engine.InvalidSettingError, match="policy"):
        engine.PrefixCache(model, policy="lru")
    with pytest.raises(engine.InvalidSettingError, match="capacity_blocks"):
        engine.PrefixCache(model, capacity_blocks=0)
    with pytest.raises(engine.InvalidSettingError, match="block_size"):
        engine.PrefixCache(model, block_size=0)
    cache = engine.PrefixCache(model, block_size=4)
    with pytest.raises(engine.InvalidSettingError, match="block size 4"):
        engine.Generation(model, "hello", block_size=8, prefix_cache=cache)
    with pytest.raises(engine.InvalidSettingError, match="another model"):
        engine.Generation(tiny_model("gpt2"), "hello", prefix_cache=cache)

"""The embedded models held in bfloat16, as the app holds them by default (KVSCOPE_DTYPE): their weights are
the float32 conversion rounded once, read from a folder of their own (mapped, never a float32 copy cast in
each process), and the engine on them equals transformers in bfloat16 on the same folder."""

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import engine
from engine import embedded
from engine.loader import AUTO
from engine.pages import file_backed_ranges
from tests.test_bf16 import assert_within_one_rounding
from tests.test_exactness import hf_model

SOURCES = {"embedded": embedded.embedded_source, embedded.ZH: embedded.zh_source}
PROMPTS = {"embedded": "The KV cache holds", embedded.ZH: "什么是KV缓存？KV缓存是"}
STEPS = 4


@pytest.mark.parametrize("spec", SOURCES)
def test_the_bfloat16_folder_is_the_float32_conversion_rounded_once(spec):
    full, half = Path(SOURCES[spec]()), Path(SOURCES[spec](torch.bfloat16))
    assert half != full and embedded.verified(half) and half.name.endswith("-bfloat16")
    assert json.loads((half / "config.json").read_text())["dtype"] == "bfloat16"
    others = {p.name for p in full.iterdir()} - {embedded.MANIFEST, embedded.WEIGHTS, "config.json"}
    assert others and all((half / name).read_bytes() == (full / name).read_bytes() for name in others)
    with safe_open(full / embedded.WEIGHTS, "pt") as ours, safe_open(half / embedded.WEIGHTS, "pt") as rounded:
        assert set(ours.keys()) == set(rounded.keys())
        for key in ours.keys():
            value = rounded.get_tensor(key)
            assert value.dtype == torch.bfloat16 and torch.equal(value, ours.get_tensor(key).to(torch.bfloat16)), key


@pytest.fixture(scope="module")
def bf16_zh() -> engine.Model:
    return engine.load_model(embedded.ZH, device="cpu", dtype=torch.bfloat16)


def test_a_bfloat16_model_reads_its_embedding_table_from_the_mapped_file(bf16_zh):
    """Gemma's 262,144 × 640 table is its largest tensor: held once, as a view of the bfloat16 file's mapping
    (no float32 table read and cast: that would be 0.67 GB more at load)."""
    table = bf16_zh.weights.embed_tokens
    assert table.dtype == torch.bfloat16 and bf16_zh.info.dtype == "bfloat16"
    start = table.data_ptr()
    end = start + table.numel() * table.element_size()
    assert any(low <= start and end <= high for low, high in file_backed_ranges())


@pytest.mark.parametrize("spec", SOURCES)
def test_engine_equals_transformers_in_bfloat16_on_the_embedded_models(spec, bf16_zh):
    """Each step against transformers doing the same step: its prefill, then its cached one-token passes. In
    bfloat16 a one-row pass and a whole-sequence pass round differently on CPUs with native bfloat16 dot products
    (AVX512-BF16: transformers' own two differ by up to 0.5 in Gemma's logits), so the whole-sequence pass is not
    the same computation."""
    model = bf16_zh if spec == embedded.ZH else engine.load_model(spec, device="cpu", dtype=torch.bfloat16)
    hf = hf_model(SOURCES[spec](torch.bfloat16), torch.bfloat16)
    generation = engine.Generation(model, PROMPTS[spec], max_new_tokens=STEPS + 1)
    trace = generation.prefill()
    with torch.inference_mode():
        out = hf(input_ids=torch.tensor([generation.prompt_ids]), use_cache=True)
        for step in range(STEPS):
            theirs = out.logits[0, -1]
            assert_within_one_rounding(trace.logits, theirs, f"{spec} step {step} logits")
            assert trace.token_id == int(theirs.argmax()), f"{spec} step {step}: greedy tokens differ"
            out = hf(input_ids=torch.tensor([[trace.token_id]]), cache=out.past_key_values, use_cache=True)
            trace = generation.step()


def test_auto_holds_smollm2_in_float32_and_gemma_in_bfloat16(bf16_zh):
    """The app's default: each embedded model in its own dtype (engine.loader.EMBEDDED_DTYPES)."""
    assert engine.load_model("embedded", device="cpu", dtype=AUTO).info.dtype == "float32"
    zh = engine.load_model(embedded.ZH, device="cpu", dtype=AUTO)
    assert zh.info.dtype == "bfloat16"
    assert torch.equal(zh.weights.embed_tokens, bf16_zh.weights.embed_tokens)


@pytest.mark.parametrize("saved, held", [(torch.float32, "float32"), (torch.bfloat16, "bfloat16")])
def test_auto_holds_another_model_in_the_dtype_it_was_saved_in(saved, held, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(tiny_model_dir("qwen3"), dtype=saved).save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((Path(tiny_model_dir("qwen3")) / name).read_bytes())
    assert engine.load_model(str(tmp_path), device="cpu", dtype=AUTO).info.dtype == held


@pytest.mark.parametrize(
    "prompt",
    ["什么是KV缓存？KV缓存是", "解释什么是Transformer", "解释什么是Transformer，举个例子", "解释什么是大语言模型"],
)
def test_gemma_in_bfloat16_gives_a_prefix_hit_the_cold_runs_tokens(prompt, bf16_zh):
    """Why Gemma may be held in bfloat16 and SmolLM2 not: a run whose prompt is partly a prefix hit computes the
    rest in fewer rows, and bfloat16 matmuls round differently then; on SmolLM2 that parted warm and cold runs
    within 40 tokens, which would make a page and its own link disagree. On Gemma, the lesson's prompts (the
    article's cases among them) give a warm run the cold run's 24 greedy tokens."""
    from engine.prefix_cache import PrefixCache

    cache = PrefixCache(bf16_zh, policy="radix", block_size=4)
    first = engine.Generation(bf16_zh, prompt, prefix_cache=cache, max_new_tokens=2)
    first.prefill()
    first.close()
    warm = engine.Generation(bf16_zh, prompt, prefix_cache=cache, max_new_tokens=24)
    cold = engine.Generation(bf16_zh, prompt, max_new_tokens=24)
    assert warm.prefill().prefix.reused_tokens > 0
    cold.prefill()
    while not cold.finished:
        warm.step()
        cold.step()
    assert warm.generated == cold.generated

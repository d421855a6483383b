"""bfloat16: the engine against transformers in the same dtype, and the memory a Qwen3-0.6B-shaped model takes.

Precision (docs/models.md, "dtype and precision"): weights, activations, residual adds and the KV cache are
bfloat16; the matmuls accumulate in float32 inside the kernels and round their outputs to bfloat16; RMSNorm's
mean-of-squares and rsqrt, softmax, and RoPE's cos/sin are computed in float32 and rounded to bfloat16
where transformers rounds them; the logits come out of lm_head in bfloat16 and are widened to float32
for sampling. Those are transformers' own (eager) casts, in the same order, so on CPU the two agree
bit for bit (measured: a difference of 0 in every tensor compared below, every family).

Tolerance, derived: bfloat16 keeps 8 significant bits, so one rounding moves a value by at most
2⁻⁸ ≈ 3.9e-3 of its magnitude. We allow each compared tensor one such rounding at its largest magnitude
(another BLAS may sum in another order and round one step differently): |engine − transformers| ≤
2⁻⁸ · max|transformers|. A float32 step where transformers rounds, or a bfloat16 softmax, is caught by
the probabilities and logits; a cache kept in another dtype by the pool's own element size.
"""

import pytest
import torch

import engine
from tests.conftest import FAMILIES
from tests.test_exactness import DECODE_STEPS, PROMPT, aligned_attention, cached_kv, hf_model, their_kv

BF16_ROUNDING = 2.0**-8  # one bfloat16 rounding, relative (8 significant bits)
GIB = 2**30
PEAK_BOUND = 1.6 * GIB  # issue 11: ≤ 1.6 GB peak (in the GiB of its 2.09 GB, measured as ru_maxrss / 2²⁰)


@pytest.fixture(scope="module")
def bf16_model(tiny_model_dir):
    loaded: dict[str, engine.Model] = {}

    def load(family: str) -> engine.Model:
        if family not in loaded:
            loaded[family] = engine.load_model(tiny_model_dir(family), device="cpu", dtype=torch.bfloat16)
        return loaded[family]

    return load


def assert_within_one_rounding(ours: torch.Tensor, theirs: torch.Tensor, what: str) -> None:
    """|ours − theirs| ≤ 2⁻⁸ · max|theirs|: at most one bfloat16 rounding at the tensor's scale."""
    theirs = theirs.float()
    bound = BF16_ROUNDING * theirs.abs().max().item()
    diff = (ours.float() - theirs).abs().max().item()
    assert diff <= bound, f"{what}: max |engine − transformers| = {diff:.3g} > {bound:.3g}"


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_engine_matches_transformers_bf16_prefill_and_32_greedy_steps(family, bf16_model, tiny_model_dir):
    model = bf16_model(family)
    hf = hf_model(tiny_model_dir(family), torch.bfloat16)
    assert model.weights.embed_tokens.dtype == hf.get_input_embeddings().weight.dtype == torch.bfloat16
    generation = engine.Generation(model, PROMPT, block_size=5, max_new_tokens=DECODE_STEPS + 1)
    assert generation.pool.k.dtype == torch.bfloat16, "the KV cache keeps the weights' dtype, as transformers' does"
    with torch.inference_mode():
        out = hf(input_ids=torch.tensor([generation.prompt_ids]), use_cache=True, output_attentions=True)
    trace = generation.prefill()
    for step in range(DECODE_STEPS + 1):
        what = f"{family} bf16 step {step}"
        assert_within_one_rounding(trace.logits, out.logits[0, -1], f"{what} logits")
        assert trace.token_id == int(out.logits[0, -1].argmax()), f"{what}: greedy tokens differ"
        for layer in range(model.info.layers):
            theirs = out.attentions[layer][0]
            ours = aligned_attention(trace.attention[layer], theirs, f"{what} L{layer}")
            assert_within_one_rounding(ours, theirs, f"{what} L{layer} attention")
            their_k, their_v = their_kv(out, layer)
            k, v = cached_kv(generation, layer, their_k.shape[-2] if model.info.window(layer) else None)
            assert_within_one_rounding(k, their_k, f"{what} L{layer} K")
            assert_within_one_rounding(v, their_v, f"{what} L{layer} V")
        if step == DECODE_STEPS:
            break
        with torch.inference_mode():
            out = hf(
                input_ids=torch.tensor([[trace.token_id]]),
                cache=out.past_key_values,
                use_cache=True,
                output_attentions=True,
            )
        trace = generation.step()
    assert len(generation.generated) == DECODE_STEPS + 1


@pytest.mark.parametrize("family", ["llama", "qwen3", "gpt2", "gemma3"])
def test_bf16_model_card_describes_the_cache_the_pool_stores(family, bf16_model, tiny_model_dir):
    """ModelInfo's dtype, element bytes and KV bytes per token are what the pool really allocates."""
    model = bf16_model(family)
    pool = model.new_pool(num_blocks=1, block_size=4)
    assert model.info.dtype == "bfloat16"
    assert model.info.element_bytes == pool.k.element_size() == 2
    assert model.info.kv_bytes_per_token == pool.bytes_per_token
    assert (
        model.info.kv_bytes_per_token * 2
        == engine.load_model(tiny_model_dir(family), device="cpu").info.kv_bytes_per_token
    )


def test_bf16_weights_are_one_copy_the_stacked_projections_views_of_it(bf16_model):
    """After loading, q/k/v and gate/up are views of their stacked weight: one tensor each, not two."""
    layer = bf16_model("qwen3").weights.layers[0]
    for part in (layer.q_proj, layer.k_proj, layer.v_proj):
        assert part.weight.untyped_storage().data_ptr() == layer.qkv.weight.untyped_storage().data_ptr()
    for part in (layer.gate_proj, layer.up_proj):
        assert part.weight.untyped_storage().data_ptr() == layer.gate_up.weight.untyped_storage().data_ptr()


def greedy_ids(folder: str, prompt: list[int], tokens: int) -> list[int]:
    """transformers' own bf16 cached greedy decode: the first `tokens` ids after `prompt`."""
    hf = hf_model(folder, torch.bfloat16)
    ids, cache = torch.tensor([prompt]), None
    generated = []
    with torch.inference_mode():
        for _ in range(tokens):
            out = hf(input_ids=ids, cache=cache, use_cache=True)
            cache, token = out.past_key_values, int(out.logits[0, -1].argmax())
            generated.append(token)
            ids = torch.tensor([[token]])
    return generated


def test_qwen3_shaped_bf16_loads_and_steps_within_the_peak_bound(qwen3_shaped_dir):
    """The generation's model of Qwen3-0.6B's exact shape, saved in bfloat16 (tests/qwen3_shaped.py), in a fresh
    process: import, load, prefill 32 tokens, 8 steps; its high-water mark (VmHWM) ≤ 1.6 GiB, and its tokens are
    transformers' greedy ones. Before the stacked projections gave back their parts' pages, the peak was 2.26 GB;
    the bf16 weights alone are 1.19 GB."""
    from bench.bf16_memory import PROMPT_IDS, measure_in_subprocess

    figures = measure_in_subprocess(qwen3_shaped_dir, "bfloat16", steps=8)
    assert figures["parameters"] == 596_049_920  # Qwen3-0.6B's count with tied embeddings
    assert figures["kv_bytes_per_token"] == 2 * 28 * 8 * 128 * 2  # 114,688 B, the article's figure
    assert figures["peak_mb"] * 1e6 <= PEAK_BOUND, f"peak {figures['peak_mb']} MB > 1.6 GiB: {figures}"
    assert figures["tokens"] == greedy_ids(qwen3_shaped_dir, PROMPT_IDS, 9)


@pytest.mark.parametrize(
    "given, dtype, bad",
    [
        (None, "auto", ""),
        ("bfloat16", "bfloat16", ""),
        (" BFloat16 ", "bfloat16", ""),
        ("float32", "float32", ""),
        (" Float32", "float32", ""),
        ("AUTO", "auto", ""),
        ("float64", "auto", "float64"),
        ("bf16", "auto", "bf16"),
    ],
)
def test_kvscope_dtype_setting(given, dtype, bad):
    from ui.host.limits import load_limits

    limits = load_limits({} if given is None else {"KVSCOPE_DTYPE": given})
    assert (limits.dtype, limits.bad_dtype) == (dtype, bad)


def own_copy(folder: str, tmp_path) -> str:
    """The tiny model in a folder of its own: the app caches loaded models by spec for the whole process."""
    import shutil

    return shutil.copytree(folder, tmp_path / "model")


@pytest.mark.parametrize(
    "setting, dtype, element",
    [("bfloat16", "bfloat16", 2), ("float32", "float32", 4), ("auto", "float32", 4), ("float64", "float32", 4)],
)
def test_the_app_runs_the_hosts_dtype_and_its_kv_bytes(setting, dtype, element, monkeypatch, tmp_path, tiny_model_dir):
    """KVSCOPE_DTYPE reaches the loaded model: the KV view's bytes name the dtype and count its element size
    (the config's shapes × 2 bytes in bfloat16); a value not understood is said so, and the default, auto, runs
    (this model was saved in float32, so float32)."""
    from transformers import AutoConfig

    from tests.app_helpers import assert_clean, start

    folder = own_copy(tiny_model_dir("qwen3"), tmp_path)
    config = AutoConfig.from_pretrained(folder)
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * element
    monkeypatch.setenv("KVSCOPE_MODELS", str(folder))
    monkeypatch.setenv("KVSCOPE_DTYPE", setting)
    at = start(model=folder, chat=0, step=2, view="kv")
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    metric = next(m for m in at.metric if m.label.startswith("K/V bytes"))
    assert metric.label == f"K/V bytes ({dtype})"
    assert metric.help.startswith(f"{per_token:,} bytes per token"), metric.help
    warnings = [w.value for w in at.warning if "KVSCOPE_DTYPE" in w.value]
    assert bool(warnings) == (setting == "float64"), warnings
    if warnings:
        assert setting in warnings[0] and "the default, auto, is used" in warnings[0]
    assert_clean(at)

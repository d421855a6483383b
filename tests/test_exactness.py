"""The engine against Hugging Face transformers on the same weights: logits, tokens, attention, K/V."""

import pytest
import torch
from transformers import AutoModelForCausalLM

import engine
from tests.conftest import FAMILIES

DECODE_STEPS = 32
PROMPT = "The KV cache stores keys and values for every layer, so decoding"


def hf_model(folder: str, dtype: torch.dtype = torch.float32):
    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="eager").eval()


def cached_kv(generation: engine.Generation, layer: int, last: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Our cache for one layer as (kv_heads, length, head_dim), the layout transformers caches; with `last`,
    its last positions only (a sliding-window layer: transformers keeps the latest window − 1 of them)."""
    k, v, _ = generation.table.read(layer)
    if last is not None:
        assert k.shape[0] >= last, f"layer {layer} holds {k.shape[0]} positions, fewer than transformers' {last}"
        k, v = k[-last:], v[-last:]
    return k.permute(1, 0, 2), v.permute(1, 0, 2)


def aligned_attention(ours: torch.Tensor, theirs: torch.Tensor, what: str) -> torch.Tensor:
    """Ours covers every position; transformers' record of a sliding-window layer's decode step covers only the
    positions it kept: ours must be 0 before them, and its last columns are compared."""
    width = theirs.shape[-1]
    assert ours.shape[:-1] == theirs.shape[:-1] and ours.shape[-1] >= width, (
        f"{what}: shapes {ours.shape}, {theirs.shape}"
    )
    assert (ours[..., :-width] == 0).all(), f"{what}: attention on a position outside the window"
    return ours[..., -width:]


def their_kv(out, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    cache = out.past_key_values.layers[layer]
    return cache.keys[0], cache.values[0]


def assert_close(ours: torch.Tensor, theirs: torch.Tensor, atol: float, what: str):
    diff = (ours.float() - theirs.float()).abs().max().item()
    assert diff <= atol, f"{what}: max |engine − transformers| = {diff:.3g} > {atol}"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("block_size", [16, 5])
def test_engine_matches_transformers_prefill_and_32_greedy_steps(family, block_size, tiny_model, tiny_model_dir):
    model = tiny_model(family)
    hf = hf_model(tiny_model_dir(family))
    generation = engine.Generation(model, PROMPT, block_size=block_size, max_new_tokens=DECODE_STEPS + 1)
    ids = torch.tensor([generation.prompt_ids])
    with torch.inference_mode():
        out = hf(input_ids=ids, use_cache=True, output_attentions=True)
    trace = generation.prefill()
    for step in range(DECODE_STEPS + 1):
        what = f"{family} step {step}"
        assert_close(trace.logits, out.logits[0, -1], 1e-4, f"{what} logits")
        assert trace.token_id == int(out.logits[0, -1].argmax()), f"{what}: greedy tokens differ"
        for layer in range(model.info.layers):
            theirs = out.attentions[layer][0]  # (q_heads, new tokens, L), the kept positions of a local layer
            if model.info.window(layer) is None:
                assert trace.attention[layer].shape == theirs.shape
            ours = aligned_attention(trace.attention[layer], theirs, f"{what} layer {layer}")
            assert_close(ours, theirs, 1e-5, f"{what} layer {layer} attention")
            their_k, their_v = their_kv(out, layer)
            k, v = cached_kv(generation, layer, their_k.shape[-2] if model.info.window(layer) else None)
            assert_close(k, their_k, 1e-5, f"{what} layer {layer} K")
            assert_close(v, their_v, 1e-5, f"{what} layer {layer} V")
        if step == DECODE_STEPS:
            break
        assert not generation.finished, f"{what}: stopped early ({generation.stop_reason})"
        with torch.inference_mode():
            out = hf(
                input_ids=torch.tensor([[trace.token_id]]),
                cache=out.past_key_values,
                use_cache=True,
                output_attentions=True,
            )
        trace = generation.step()
    assert generation.stop_reason == "max_new_tokens"
    assert len(generation.generated) == DECODE_STEPS + 1


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_scores_are_the_scaled_dot_products_behind_the_probabilities(family, tiny_model):
    """The raw scores are q·k/√d with −inf on the causal mask; their softmax is the recorded attention."""
    generation = engine.Generation(tiny_model(family), PROMPT, max_new_tokens=4)
    trace = generation.prefill()
    scores = trace.scores
    t = len(generation.prompt_ids)
    future = torch.ones(t, t, dtype=torch.bool).triu(1)
    assert torch.isinf(scores[:, :, future]).all() and (scores[:, :, future] < 0).all()
    assert torch.isfinite(scores[:, :, ~future]).all()
    assert_close(torch.softmax(scores, dim=-1), trace.attention, 1e-6, "softmax(scores)")
    assert (trace.attention[:, :, future] == 0).all()


@pytest.mark.parametrize("family", ["gpt2", "qwen3"])
def test_next_input_is_what_transformers_feeds_the_first_layer(family, tiny_model, tiny_model_dir):
    """The next step's input for the drawn id: GPT-2's token row plus its position's row (wte + wpe),
    a RoPE family's token row alone; the next decode step starts from exactly that vector."""
    model = tiny_model(family)
    hf = hf_model(tiny_model_dir(family))
    generation = engine.Generation(model, PROMPT, max_new_tokens=3)
    trace = generation.prefill()
    with torch.inference_mode():
        out = hf(input_ids=torch.tensor([generation.prompt_ids + [trace.token_id]]), output_hidden_states=True)
    assert_close(trace.next_input_embedding, out.hidden_states[0][0, -1], 1e-6, f"{family} next input")
    if family == "gpt2":
        token_row = hf.get_input_embeddings().weight[trace.token_id]
        assert (trace.next_input_embedding - token_row).abs().max() > 1e-3, "GPT-2 adds the position row"
    step = generation.step()
    assert torch.equal(step.residual[0, 0], trace.next_input_embedding)


def test_residual_stream_and_dual_path_match_transformers(tiny_model, tiny_model_dir):
    """x0/x2 per layer equal transformers' hidden states; the next input is the new id's embedding row."""
    model = tiny_model("qwen3")
    hf = hf_model(tiny_model_dir("qwen3"))
    generation = engine.Generation(model, PROMPT, max_new_tokens=3)
    trace = generation.prefill()
    with torch.inference_mode():
        out = hf(input_ids=torch.tensor([generation.prompt_ids]), output_hidden_states=True)
    hidden = out.hidden_states  # embeddings, then after each layer (the last one after the final norm)
    for layer in range(model.info.layers):
        assert_close(trace.residual[layer, 0], hidden[layer][0, -1], 1e-5, f"x0 of layer {layer}")
    for layer in range(model.info.layers - 1):
        assert_close(trace.residual[layer, 2], hidden[layer + 1][0, -1], 1e-5, f"x2 of layer {layer}")
    assert_close(trace.final_hidden, hidden[-1][0, -1], 1e-5, "final norm output")
    embedding = hf.get_input_embeddings().weight[trace.token_id]
    assert torch.equal(trace.next_input_embedding, embedding.detach())
    step = generation.step()
    assert step.input_ids == [trace.token_id]
    assert step.positions == [len(generation.prompt_ids)]
    assert torch.equal(step.residual[0, 0], embedding.detach()), (
        "decode input is the embedding row, not the last hidden"
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_a_pause_between_layers_comes_after_each_layer_and_changes_no_number(family, tiny_model):
    """`engine.between_layers`: the app lets other pages in during a long pass; the pass is the same pass."""
    model = tiny_model(family)
    prompt = "A pause between two layers changes nothing"
    plain = engine.Generation(model, prompt, max_new_tokens=3)
    paused = engine.Generation(model, prompt, max_new_tokens=3)
    pauses = []
    expected = [plain.prefill(), plain.step()]
    with engine.between_layers(lambda: pauses.append(1)):
        got = [paused.prefill(), paused.step()]
    assert len(pauses) == 2 * model.info.layers
    for a, b in zip(expected, got):
        assert torch.equal(a.logits, b.logits) and a.token_id == b.token_id
    plain.close()
    paused.close()

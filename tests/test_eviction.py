"""KV eviction (engine.eviction) against references written here from each policy's definition (kvpress 0.5.5's),
scored from transformers' eager attention weights and cached keys; decode over the evicted cache against
transformers' eager attention with the same positions masked per (layer, KV head)."""

import math
import sys

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, DynamicCache

from engine.errors import InvalidSettingError
from engine.eviction import DecodeBudget, EvictionRun, Policy, StreamingWindow, stream_nll
from engine.rope import apply_rope
from engine.trace import Capture

PROMPT = (
    "Serving systems keep a cache of keys and values; when it no longer fits, they evict some positions and "
    "keep the ones a score ranks highest, then decode"
)
FAMILIES = ["llama", "qwen3", "llama3-rope"]  # GQA 4:2, q/k norms, one KV head for all four Q heads
PRESS_CASES = [
    ("streaming_llm", {"n_sink": 4}),
    ("knorm", {}),
    ("keydiff", {}),
    ("snapkv", {"window_size": 8, "kernel_size": 5}),
    ("tova", {}),
    ("observed_attention", {}),
]
# The tiny Qwen3's k_norm weights are all 1, so every key has norm √head_dim up to rounding (RoPE keeps norms):
# key-norm's order there is rounding noise, not a policy. Qwen3 runs the other policies.
CASES = [
    (family, name, params)
    for family in FAMILIES
    for name, params in PRESS_CASES
    if (family, name) != ("qwen3", "knorm")
]
LOGIT_ATOL = 1e-4
STEPS = 4


def hf_model(folder: str):
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()


def prompt_ids(model) -> list[int]:
    return model.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]


# -- the references: each policy from its definition --------------------------------------------------


def top(scores: torch.Tensor, count: int, among: list[int]) -> set[int]:
    """The `count` positions of `among` with the highest scores (scores indexed like `among`)."""
    order = sorted(range(len(among)), key=lambda i: -float(scores[i]))
    return {among[i] for i in order[:count]}


def reference_kept(
    name: str, params: dict, attention: torch.Tensor, keys: torch.Tensor, held: list[int], n_kept: int, kv_head: int
) -> set[int]:
    """The positions one KV head keeps of `held` (ascending), by the definition of policy `name`.

    attention: (q_heads, rows, L) transformers' eager weights of the queries that score (a prefill's rows
    over its n positions, or one decode row), over positions; keys: (kv_heads, L, D) as transformers caches them.
    """
    q_heads = attention.shape[0]
    group = q_heads // keys.shape[0]
    mine = range(kv_head * group, (kv_head + 1) * group)  # the Q heads that read this KV head
    a = attention[:, :, held]  # over the rows held, in position order
    n = len(held)
    if name == "streaming_llm":  # the first n_sink, and the latest of the rest
        sinks = params["n_sink"]
        return set(held[:sinks]) | set(held[n - (n_kept - sinks) :])
    if name == "knorm":  # the smallest key norms
        return top(-keys[kv_head, held].norm(dim=-1), n_kept, held)
    if name == "keydiff":  # the keys whose direction is furthest from the mean of the held keys' directions
        k = keys[kv_head, held].double()
        anchor = (k / k.norm(dim=-1, keepdim=True)).mean(dim=0)
        return top(-(k @ anchor) / (k.norm(dim=-1) * anchor.norm()), n_kept, held)
    if name == "snapkv":  # the window's queries, averaged; a mean over kernel neighbours (zeros past the ends)
        w, k = params["window_size"], params["kernel_size"]
        per_q = a[list(mine), -w:, : n - w].mean(dim=1)  # (group, n − w)
        pooled = torch.stack(
            [per_q[:, max(0, j - k // 2) : j + k // 2 + 1].sum(dim=1) / k for j in range(n - w)], dim=1
        )
        return set(held[n - w :]) | top(pooled.mean(dim=0), n_kept - w, held[: n - w])
    if name == "tova":  # the last query, averaged over every Q head; itself always kept
        return {held[-1]} | top(a[:, -1, : n - 1].mean(dim=0), n_kept - 1, held[: n - 1])
    if name == "observed_attention":  # attention received, per query that could see it, over the group
        rows = a.shape[1]
        received = torch.stack([a[list(mine), :, j].sum(dim=1) / (n - j) for j in range(n)], dim=1)  # (group, n)
        assert rows in (1, n)
        return top(received.mean(dim=0), n_kept, held)
    raise ValueError(name)


def masked_hf_pass(hf, run: EvictionRun, monkeypatch) -> tuple[torch.Tensor, object]:
    """transformers' eager forward over the run's whole sequence, each query at or after the last prompt token
    seeing only what its step kept in each (layer, KV head): its logits (T, vocab) and output."""
    inputs = run.prompt_ids[:-1] + [s.input_id for s in run.steps]  # greedy or teacher-forced alike
    length = len(inputs)
    config = hf.config
    q_heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    lowest = torch.finfo(torch.float32).min
    masks = []
    for layer in range(config.num_hidden_layers):
        extra = torch.zeros(1, q_heads, length, length)
        for step in run.steps:
            if step.kept[layer] is None:  # a sliding-window layer: its window only, as transformers' own mask says
                continue
            hidden = ~step.kept[layer].repeat_interleave(q_heads // kv_heads, dim=0)  # (q_heads, p + 1)
            extra[0, :, step.position, : step.position + 1][hidden] = lowest
        masks.append(extra)
    module = sys.modules[type(hf.model.layers[0].self_attn).__module__]
    eager = module.eager_attention_forward

    def evicted_eager(attn, query, key, value, attention_mask, **kwargs):
        causal = torch.full((length, length), lowest).triu(1)[None, None] if attention_mask is None else attention_mask
        return eager(attn, query, key, value, causal + masks[attn.layer_idx], **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(module, "eager_attention_forward", evicted_eager)
        with torch.no_grad():
            out = hf(torch.tensor([inputs]), output_attentions=True)
    return out.logits[0], out


def assert_decode_matches(hf, run: EvictionRun, monkeypatch):
    logits, out = masked_hf_pass(hf, run, monkeypatch)
    for step in run.steps:
        diff = (step.logits - logits[step.position]).abs().max().item()
        assert diff <= LOGIT_ATOL, f"step {step.step}: max |engine − transformers masked| = {diff:.3g}"
        assert step.token_id == int(logits[step.position].argmax()), f"step {step.step}: another greedy token"
    return out


# -- the tests ------------------------------------------------------------------------------------


@pytest.mark.parametrize("family,name,params", CASES)
@pytest.mark.parametrize("ratio", [0.5, 0.35])  # 0.35: n × 0.65 ends in .8, so rounding matters
def test_kept_positions_after_the_prefill_equal_the_definition_and_decode_equals_masked_eager(
    family, name, params, ratio, tiny_model, tiny_model_dir, monkeypatch
):
    model, hf = tiny_model(family), hf_model(tiny_model_dir(family))
    ids = prompt_ids(model)
    n = len(ids) - 1
    run = EvictionRun(model, ids, Policy(name, **params), compression_ratio=ratio, max_new_tokens=STEPS)
    run.prefill()
    with torch.no_grad():
        out = hf(torch.tensor([ids[:-1]]), output_attentions=True)
    n_kept = math.floor(n * (1 - ratio))
    for layer in range(model.info.layers):
        keys = out.past_key_values.layers[layer].keys[0]
        for head in range(model.info.kv_heads):
            expected = reference_kept(name, params, out.attentions[layer][0], keys, list(range(n)), n_kept, head)
            kept = set(run.kept_positions(layer, head)) - {n}  # n: the last prompt token, read after the eviction
            assert len(kept) == n_kept < n
            assert kept == expected, f"layer {layer}, KV head {head}: kept {sorted(kept)}, expected {sorted(expected)}"
    while not run.finished:
        run.step()
    assert len(run.steps) == STEPS
    assert_decode_matches(hf, run, monkeypatch)


ORDER_FREE = ("knorm", "keydiff", "tova")  # scores that do not depend on the order of the rows an eviction left


@pytest.mark.parametrize(
    "name,params",
    [(name, {"window_size": 2, "kernel_size": 3} if name == "snapkv" else params) for name, params in PRESS_CASES],
)
def test_a_decode_budget_holds_after_twice_its_size_in_steps_and_keeps_what_the_definition_keeps(
    name, params, tiny_model, tiny_model_dir, monkeypatch
):
    """DecodingPress: every `interval` passes, each (layer, KV head) holding more than target_size rows keeps
    target_size, scored from that pass (its keys, or its query's attention from transformers). The first eviction
    scores rows in position order, as the definitions read; later ones are checked for the policies whose scores
    do not depend on the order top-k left the rows in."""
    family = "llama"
    model, hf = tiny_model(family), hf_model(tiny_model_dir(family))
    ids = prompt_ids(model)
    budget = DecodeBudget(target_size=12, interval=3)
    run = EvictionRun(model, ids, Policy(name, **params), budget=budget, max_new_tokens=2 * budget.target_size)
    run.prefill()
    while not run.finished:
        run.step()
    assert len(run.steps) == 2 * budget.target_size
    out = assert_decode_matches(hf, run, monkeypatch)
    info = model.info
    evictions = 0
    for i, step in enumerate(run.steps):
        for layer in range(info.layers):
            held = step.kept[layer]  # what this pass read: all the positions held, the pass's own included
            if i >= budget.interval:  # once the first eviction (after pass `interval`) has run
                assert (held.sum(dim=1) <= budget.target_size + budget.interval).all()
            if step.evictions[layer] is None:
                continue
            evictions += 1
            if name not in ORDER_FREE and i >= budget.interval:
                continue
            keys = out.past_key_values.layers[layer].keys[0]
            attention = out.attentions[layer][0][:, step.position : step.position + 1]
            for head in range(info.kv_heads):
                before = torch.nonzero(held[head]).flatten().tolist()
                expected = reference_kept(name, params, attention, keys, before, budget.target_size, head)
                after = (
                    set(run.steps[i + 1].kept[layer][head].nonzero().flatten().tolist()) - {step.position + 1}
                    if i + 1 < len(run.steps)
                    else set(run.kept_positions(layer, head))
                )
                assert after == expected, f"step {i}, layer {layer}, head {head}"
    assert evictions == info.layers * (len(run.steps) // budget.interval)  # the cache is over budget at each
    # The budget's bytes: what the rows hold is counted per (layer, KV head); masking frees no block.
    rows = [len(run.kept_positions(layer, 0)) for layer in range(info.layers)]
    assert all(r <= budget.target_size + budget.interval - 1 for r in rows)
    per_row = 2 * info.head_dim * 4  # K and V of one KV head at one position, float32
    assert run.kept_bytes() == sum(rows) * info.kv_heads * per_row
    assert run.kept_bytes() <= info.layers * info.kv_heads * (budget.target_size + budget.interval - 1) * per_row
    assert run.full_bytes() == run.table.length * info.layers * info.kv_heads * per_row > 2 * run.kept_bytes()
    assert run.allocated_bytes() >= run.full_bytes()


def test_the_streaming_window_keeps_the_sinks_and_the_latest_positions_every_step(
    tiny_model, tiny_model_dir, monkeypatch
):
    family = "llama3-rope"
    model, hf = tiny_model(family), hf_model(tiny_model_dir(family))
    ids = prompt_ids(model)
    window = StreamingWindow(n_sink=4, window=8)
    run = EvictionRun(model, ids, budget=window, max_new_tokens=2 * (window.n_sink + window.window))
    run.prefill()
    while not run.finished:
        run.step()
    for step in run.steps[1:]:  # every pass after the first reads the sinks and the window the last one left
        previous = step.position - 1
        expected = set(range(window.n_sink)) | set(range(previous - window.window + 1, previous + 1)) | {step.position}
        for layer in range(model.info.layers):
            assert set(step.kept[layer][0].nonzero().flatten().tolist()) == expected
    assert_decode_matches(hf, run, monkeypatch)
    share = run.steps[-1].evicted_share
    assert share.shape == (model.info.layers, model.info.q_heads) and ((share > 0) & (share < 1)).all()


@pytest.mark.parametrize(
    "family,window",
    [
        ("llama3-rope", StreamingWindow(n_sink=2, window=6)),
        ("llama", StreamingWindow(n_sink=0, window=5)),
        ("llama", None),
        ("gemma3", StreamingWindow(n_sink=2, window=6)),
    ],
)
def test_a_stream_read_in_one_pass_equals_the_run_read_pass_by_pass_and_masked_eager(
    family, window, tiny_model, tiny_model_dir, monkeypatch
):
    """StreamingLLM's experiment, teacher-forced: a text's NLL through a streaming window (a window alone, sinks plus
    a window, or the full cache), in passes of many positions, equals an EvictionRun fed the same text pass by pass
    (`step(input_id)`) and transformers' eager attention with the same positions masked (Gemma's local layers keep
    their own window)."""
    model, hf = tiny_model(family), hf_model(tiny_model_dir(family))
    ids = prompt_ids(model)
    n = len(ids) - 1
    nll = stream_nll(model, ids, window, chunk=7)  # chunks that end mid-window
    run = EvictionRun(model, ids[:2], budget=window, max_new_tokens=n)
    run.prefill()  # position 0 in full, then the pass at position 1
    with pytest.raises(InvalidSettingError):
        run.step(input_id=model.info.vocab)
    for p in range(2, n + 1):
        run.step(input_id=ids[p])
    assert [s.position for s in run.steps] == list(range(1, n + 1)) and run.finished
    targets = torch.tensor(ids[1:])
    by_pass = torch.stack([-torch.log_softmax(s.logits, dim=-1)[ids[s.position + 1]] for s in run.steps[:-1]])
    assert nll.shape == (n,) and torch.allclose(nll[1:], by_pass, atol=1e-5)
    logits = assert_decode_matches(hf, run, monkeypatch).logits[0]
    assert torch.allclose(nll, F.cross_entropy(logits[:n], targets, reduction="none"), atol=1e-5)


@pytest.mark.parametrize(
    "name,params",
    [("snapkv", {"window_size": 8, "kernel_size": 7}), ("streaming_llm", {"n_sink": 4}), ("observed_attention", {})],
)
def test_the_embedded_model_keeps_what_the_definition_keeps_and_decodes_as_masked_eager(
    name, params, embedded_model, embedded_folder, monkeypatch
):
    hf = hf_model(embedded_folder)
    ids = prompt_ids(embedded_model)
    n = len(ids) - 1
    run = EvictionRun(embedded_model, ids, Policy(name, **params), compression_ratio=0.5, max_new_tokens=3)
    run.prefill()
    with torch.no_grad():
        out = hf(torch.tensor([ids[:-1]]), output_attentions=True)
    for layer in range(embedded_model.info.layers):
        keys = out.past_key_values.layers[layer].keys[0]
        for head in range(embedded_model.info.kv_heads):
            expected = reference_kept(name, params, out.attentions[layer][0], keys, list(range(n)), n // 2, head)
            assert set(run.kept_positions(layer, head)) - {n} == expected, f"layer {layer}, KV head {head}"
    while not run.finished:
        run.step()
    assert_decode_matches(hf, run, monkeypatch)


@pytest.mark.parametrize("name,params", [("snapkv", {"window_size": 8, "kernel_size": 5}), ("tova", {})])
def test_gemma_evicts_in_its_global_layers_only(name, params, tiny_model, tiny_model_dir, monkeypatch):
    """Gemma 3's local layers keep their sliding window (the built-in policy); the policy evicts in the global ones."""
    model, hf = tiny_model("gemma3"), hf_model(tiny_model_dir("gemma3"))
    ids = prompt_ids(model)
    n = len(ids) - 1
    run = EvictionRun(model, ids, Policy(name, **params), compression_ratio=0.5, max_new_tokens=STEPS)
    run.prefill()
    with torch.no_grad():
        out = hf(torch.tensor([ids[:-1]]), output_attentions=True)
    for layer in range(model.info.layers):
        if model.info.window(layer) is not None:
            assert run.steps[0].kept[layer] is None and run.prefill_evictions[layer] is None
            assert run.kept_positions(layer, 0) == list(range(n + 1 - model.info.window(layer), n + 1))
            continue
        keys = out.past_key_values.layers[layer].keys[0]
        expected = reference_kept(name, params, out.attentions[layer][0], keys, list(range(n)), n // 2, 0)
        assert set(run.kept_positions(layer, 0)) - {n} == expected
    while not run.finished:
        run.step()
    assert_decode_matches(hf, run, monkeypatch)


def test_evicted_share_is_what_full_attention_puts_on_the_evicted_positions(tiny_model):
    """In the first layer the last prompt token's query does not depend on what was evicted, so its full attention is
    that of a pass over the same cache with nothing hidden; the share is that attention summed over what was evicted,
    and the attention the run used is 0 there."""
    model = tiny_model("llama")
    run = EvictionRun(model, prompt_ids(model), Policy("knorm"), compression_ratio=0.5, max_new_tokens=1)
    first = run.prefill()
    full = model.forward(
        [first.input_id], [first.position], run.table, Capture(residuals=False), write=False
    ).attention[0, :, -1]  # (q_heads, L)
    hidden = ~first.kept[0].repeat_interleave(model.info.gqa_group, dim=0)
    assert hidden.any()
    assert torch.allclose(first.evicted_share[0], (full * hidden).sum(dim=-1), atol=1e-6)
    for layer in range(model.info.layers):
        assert (first.attention[layer][~first.kept[layer].repeat_interleave(model.info.gqa_group, dim=0)] == 0).all()
    run.close()


@pytest.mark.parametrize(
    "make",
    [
        lambda m: EvictionRun(m, [1, 2, 3], Policy("knorm"), compression_ratio=1.0),
        lambda m: EvictionRun(m, [1, 2, 3], Policy("knorm"), compression_ratio=-0.1),
        lambda m: EvictionRun(m, [1], Policy("knorm"), compression_ratio=0.5),
        lambda m: EvictionRun(m, [1, 2, 3], compression_ratio=0.5),
        lambda m: EvictionRun(m, [1, 2, 3], Policy("knorm"), budget=DecodeBudget(target_size=0)),
        lambda m: EvictionRun(m, [1, 2, 3], Policy("snapkv", window_size=8), budget=DecodeBudget(16, interval=8)),
        lambda m: EvictionRun(m, [1, 2, 3], Policy("streaming_llm", n_sink=4), budget=DecodeBudget(4, interval=2)),
        lambda m: Policy("h2o"),
        lambda m: Policy("snapkv", kernel_size=4),
        lambda m: EvictionRun(m, [1, 2, 3, 4, 5], Policy("snapkv", window_size=8), compression_ratio=0.5).prefill(),
        lambda m: EvictionRun(m, [1, 2, 3, 4, 5], Policy("streaming_llm"), compression_ratio=0.5).prefill(),
    ],
)
def test_bad_settings_raise_a_clear_error(make, tiny_model):
    with pytest.raises(InvalidSettingError):
        make(tiny_model("llama"))


# -- re-rotated positions (kvpress's KeyRerotationPress) ------------------------------------------------------


def rerotated_hf_logits(hf, run: EvictionRun) -> list[torch.Tensor]:
    """transformers over a compacted cache built here: the context's keys and values from its own prefill, each
    (layer, KV head) keeping the run's kept positions, the keys turned to 0 … n_kept − 1 (R(new − old), RoPE's
    rotate-half form); then the run's passes one token at a time from position n_kept. The logits of each."""
    n = len(run.prompt_ids) - 1
    with torch.no_grad():
        prefill = hf(torch.tensor([run.prompt_ids[:-1]]), use_cache=True)
    inv_freq = hf.model.rotary_emb.inv_freq.float()
    cache = DynamicCache(config=hf.config)
    for layer in range(hf.config.num_hidden_layers):
        keys, values = prefill.past_key_values.layers[layer].keys, prefill.past_key_values.layers[layer].values
        kept = run.prefill_evictions[layer].kept_positions  # (kv_heads, n_kept) ascending
        n_kept = kept.shape[1]
        index = kept[None, :, :, None].expand(1, -1, -1, keys.shape[-1])
        k, v = keys.gather(2, index), values.gather(2, index)
        angles = (torch.arange(n_kept)[None, :] - kept).float()[..., None] * inv_freq  # (kv_heads, n_kept, D / 2)
        angles = torch.cat((angles, angles), dim=-1)[None]
        half = k.shape[-1] // 2
        k = k * angles.cos() + torch.cat((-k[..., half:], k[..., :half]), dim=-1) * angles.sin()
        cache.update(k, v, layer)
    logits = []
    with torch.no_grad():
        for i, step in enumerate(run.steps):
            out = hf(
                torch.tensor([[step.input_id]]), position_ids=torch.tensor([[n_kept + i]]), cache=cache, use_cache=True
            )
            logits.append(out.logits[0, -1])
    assert n_kept < n
    return logits


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    "name,params", [("snapkv", {"window_size": 8, "kernel_size": 5}), ("streaming_llm", {"n_sink": 4})]
)
def test_rerotated_keys_decode_as_transformers_over_a_compacted_cache(family, name, params, tiny_model, tiny_model_dir):
    model, hf = tiny_model(family), hf_model(tiny_model_dir(family))
    run = EvictionRun(
        model, prompt_ids(model), Policy(name, **params), compression_ratio=0.5, max_new_tokens=STEPS, rerotate=True
    )
    run.prefill()
    while len(run.steps) < STEPS:
        run.step()
    plain = EvictionRun(model, prompt_ids(model), Policy(name, **params), compression_ratio=0.5, max_new_tokens=1)
    plain.prefill()
    assert (plain.steps[0].logits - run.steps[0].logits).abs().max() > 1e-3, "re-rotation changed nothing"
    for step, expected in zip(run.steps, rerotated_hf_logits(hf, run), strict=True):
        diff = (step.logits - expected).abs().max().item()
        assert diff <= LOGIT_ATOL, f"step {step.step}: max |engine − transformers| = {diff:.3g}"
        assert step.token_id == int(expected.argmax())
    run.close(), plain.close()


def test_a_kept_suffix_rerotated_reads_as_it_did_unturned(tiny_model):
    """Keeping only the latest positions (no sinks), re-rotation moves every kept key and every later query by the
    same number of positions: RoPE sees the same distances, so the logits are those of the run without it."""
    model = tiny_model("llama")
    runs = [
        EvictionRun(
            model,
            prompt_ids(model),
            Policy("streaming_llm", n_sink=0),
            compression_ratio=0.5,
            max_new_tokens=STEPS,
            rerotate=rerotate,
        )
        for rerotate in (False, True)
    ]
    for run in runs:
        run.prefill()
        while len(run.steps) < STEPS:
            run.step()
    for a, b in zip(*(run.steps for run in runs), strict=True):
        torch.testing.assert_close(a.logits, b.logits, atol=1e-5, rtol=0)
        assert a.token_id == b.token_id


@pytest.mark.parametrize(
    "family,make",
    [
        ("gemma3", lambda m: EvictionRun(m, [1, 2, 3, 4, 5], Policy("knorm"), compression_ratio=0.5, rerotate=True)),
        ("gpt2", lambda m: EvictionRun(m, [1, 2, 3, 4, 5], Policy("knorm"), compression_ratio=0.5, rerotate=True)),
        ("llama", lambda m: EvictionRun(m, [1, 2, 3, 4, 5], Policy("knorm"), rerotate=True)),
        ("llama", lambda m: EvictionRun(m, [1, 2, 3, 4, 5], None, budget=StreamingWindow(1, 2), rerotate=True)),
    ],
)
def test_rerotation_where_kvpress_has_none_is_refused(family, make, tiny_model):
    with pytest.raises(InvalidSettingError, match="re-rotation"):
        make(tiny_model(family))


def rerotated_stream_hf_nll(hf, ids: list[int], window: StreamingWindow, monkeypatch) -> torch.Tensor:
    """transformers' NLL of `ids` read through `window` with the StreamingLLM paper's positions inside the cache:
    each query at p reads its positions (the window's own mask), and the sinks as if they sat right before the
    window it reads, i.e. each sink key turned on by the gap p's window left after them (RoPE's rotate-half form,
    on the key side here; the engine turns the query back)."""
    n, sinks = len(ids) - 1, window.n_sink
    reads = window.reads(n)
    held = [torch.nonzero(row).flatten() for row in reads]  # what each query reads, ascending
    gaps = torch.tensor([int(h[sinks]) - sinks if len(h) > sinks else 0 for h in held])  # after the sinks
    lowest = torch.finfo(torch.float32).min
    mask = torch.where(reads, 0.0, lowest)[None, None]  # (1, 1, n, n): reads are causal already
    inv_freq = hf.model.rotary_emb.inv_freq.float()
    module = sys.modules[type(hf.model.layers[0].self_attn).__module__]

    def streamed_eager(attn, query, key, value, attention_mask, scaling, **kwargs):
        group = attn.num_key_value_groups
        k, v = (x.repeat_interleave(group, dim=1) for x in (key, value))  # (1, heads, n, D)
        weights = query @ k.transpose(2, 3) * scaling
        angles = gaps.float()[:, None] * inv_freq  # (n, D / 2)
        angles = torch.cat((angles, angles), dim=-1)[None, None, :, None]  # (1, 1, n, 1, D)
        sink = k[:, :, None, :sinks]  # (1, heads, 1, s, D)
        half = sink.shape[-1] // 2
        turned = sink * angles.cos() + torch.cat((-sink[..., half:], sink[..., :half]), dim=-1) * angles.sin()
        weights[..., :sinks] = torch.einsum("bhpd,bhpsd->bhps", query, turned) * scaling
        probs = torch.softmax(weights + mask, dim=-1, dtype=torch.float32)
        return (probs @ v).transpose(1, 2).contiguous(), probs

    with monkeypatch.context() as patch:
        patch.setattr(module, "eager_attention_forward", streamed_eager)
        with torch.no_grad():
            logits = hf(torch.tensor([ids[:-1]])).logits[0]
    return F.cross_entropy(logits, torch.tensor(ids[1:]), reduction="none")


@pytest.mark.parametrize("family", ["llama", "qwen3", "llama3-rope"])
def test_a_stream_with_positions_inside_the_cache_equals_transformers(family, tiny_model, tiny_model_dir, monkeypatch):
    model, hf = tiny_model(family), hf_model(tiny_model_dir(family))
    ids = prompt_ids(model)
    window = StreamingWindow(n_sink=2, window=5)
    turned = stream_nll(model, ids, window, chunk=7, rerotate=True)
    expected = rerotated_stream_hf_nll(hf, ids, window, monkeypatch)
    assert torch.allclose(turned, expected, atol=1e-5), (turned - expected).abs().max()
    kept_numbering = stream_nll(model, ids, window, chunk=7)
    assert (turned - kept_numbering).abs().max() > 1e-3, "the numbering changed nothing"
    no_sinks = StreamingWindow(n_sink=0, window=5)  # nothing before the window: the distances are the same
    assert torch.allclose(stream_nll(model, ids, no_sinks, rerotate=True), stream_nll(model, ids, no_sinks), atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "llama3-rope", "gemma3"])
def test_a_turned_key_is_the_unrotated_key_rotated_at_its_new_position(family, tiny_model):
    """`Rope.turned`: a key cached at position p, turned on by d, is the same key before rotation rotated at p + d
    by the model's own RoPE (attention scaling included once), for every layer kind's frequencies."""
    model = tiny_model(family)
    for rope in model.ropes.values():
        generator = torch.Generator().manual_seed(0)
        raw = torch.randn(6, 2, model.info.head_dim, generator=generator)  # (positions, kv_heads, D), unrotated
        positions = torch.tensor([0, 3, 7, 20, 41, 100])
        turns = torch.tensor([[5, -3, 0, -20, 9, -60], [1, 2, 3, 4, 5, 6]])  # (kv_heads, positions)
        cached = apply_rope(raw, *rope.cos_sin(positions, torch.float32))
        turned = rope.turned(cached, turns)
        for head in range(2):
            expected = apply_rope(raw[:, head : head + 1], *rope.cos_sin(positions + turns[head], torch.float32))
            torch.testing.assert_close(turned[:, head : head + 1], expected, atol=1e-5, rtol=1e-5)

"""The presses that keep counts of their own or score without attention (PyramidKV's per-layer budgets, AdaKV's
per-head budgets, LagKV, ExpectedAttention) against references written here from their definitions (kvpress
0.5.5's), read from transformers' eager weights, caches and queries; decode over what they kept against
transformers' eager attention with the same positions masked."""

import math

import pytest
import torch
import torch.nn.functional as F

from engine.errors import InvalidSettingError
from engine.eviction import DecodeBudget, EvictionRun, Policy, StreamingWindow, forced_nll, stream_nll
from engine.eviction.policies import LayerInputs, select_per_head
from tests.test_eviction import assert_decode_matches, hf_model, prompt_ids, top

FAMILIES = ["llama", "qwen3", "llama3-rope"]
STEPS = 3


def prefill_of(hf, ids: list[int]) -> tuple[object, list[torch.Tensor]]:
    """transformers' eager prefill of the context, and per layer its queries before RoPE (q_heads, n, D), after
    Qwen3's q_norm: what ExpectedAttention reads."""
    queries, hooks = {}, []
    for index, layer in enumerate(hf.model.layers):
        attention = layer.self_attn
        last = getattr(attention, "q_norm", None) or attention.q_proj  # the queries' last step before RoPE

        def keep(module, args, output, index=index, heads=hf.config.num_attention_heads):
            queries[index] = output[0].reshape(output.shape[1], heads, -1).transpose(0, 1)

        hooks.append(last.register_forward_hook(keep))
    try:
        with torch.no_grad():
            out = hf(torch.tensor([ids[:-1]]), output_attentions=True)
    finally:
        for hook in hooks:
            hook.remove()
    return out, [queries[i] for i in range(len(hf.model.layers))]


def snapkv_scores(attention: torch.Tensor, kv_head: int, group: int, window: int, kernel: int) -> list[float]:
    """SnapKV's score of each of n positions for one KV head: the window's queries averaged, a mean over `kernel`
    neighbours (zeros past the ends), over the group; the window's own positions above every other."""
    n = attention.shape[-1]
    per_q = attention[kv_head * group : (kv_head + 1) * group, -window:, : n - window].double().mean(dim=1)
    pooled = [
        float(per_q[:, max(0, j - kernel // 2) : j + kernel // 2 + 1].sum(dim=1).mean() / kernel)
        for j in range(n - window)
    ]
    return pooled + [max(pooled) + 1] * window


def ada_kept(scores: list[list[float]], n_kept: int, alpha: float) -> list[set[int]]:
    """AdaKV's selection over a layer's heads: each head's top max(1, int(n_kept × alpha)) first, then the
    kv_heads × (n − n_kept) lowest of the rest, over every head at once, evicted."""
    n = len(scores[0])
    safe = max(1, int(n_kept * alpha))
    protected = [top(torch.tensor(s), safe, list(range(n))) for s in scores]
    rest = sorted((s[i], h, i) for h, s in enumerate(scores) for i in range(n) if i not in protected[h])
    evicted = {(h, i) for _, h, i in rest[: len(scores) * (n - n_kept)]}
    return [{i for i in range(n) if (h, i) not in evicted} for h in range(len(scores))]


def lag_scores(keys: torch.Tensor, values: torch.Tensor, n_sink: int, lag: int) -> list[float]:
    """LagKV's score of each of n positions for one KV head (keys, values (n, D)): see engine.eviction.policies."""
    n = keys.shape[0]
    if n < n_sink + 2 * lag:
        return [1.0] * n_sink + [i / (n - n_sink) for i in range(n - n_sink)]
    end = n_sink + (n - n_sink) // lag * lag
    scores = [1.0] * n
    for start in range(n_sink, end - lag, lag):
        rows, reference = slice(start, start + lag), slice(start + lag, start + 2 * lag)
        stood_out = 0
        for x in (keys.double(), values.double()):
            low, high = x[reference].min(dim=0).values, x[reference].max(dim=0).values
            stood_out = stood_out + torch.softmax(((x[rows] - low) / (high - low)).std(dim=-1), dim=0) / 2
        for rank, row in enumerate(sorted(range(lag), key=lambda r: float(stood_out[r]))):
            scores[start + row] = rank / lag
    return scores


def expected_scores(
    hf, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, kv_head: int, n_sink: int, future: int
) -> list[float]:
    """ExpectedAttention's score of each of n positions for one KV head: the t queries after the sinks as a Gaussian
    (mean, covariance), each moved by the rotation averaged over positions t … t + future − 1 (built here by
    rotating the basis vectors), exp(k·μ/√d + kᵀΣk/2d) normalised over the positions, averaged over the group,
    times ‖v‖; the sinks above every other."""
    q_heads, d = queries.shape[0], keys.shape[-1]
    group = q_heads // keys.shape[0]
    positions = torch.arange(queries.shape[1], queries.shape[1] + future)[None]  # kvpress counts from its queries
    cos, sin = (t[0].double() for t in hf.model.rotary_emb(torch.zeros(1, dtype=torch.float64), positions))
    basis = torch.eye(d, dtype=torch.float64)
    half = torch.cat((-basis[:, d // 2 :], basis[:, : d // 2]), dim=1)  # rotate_half of each basis row
    turn = (basis[None] * cos[:, None] + half[None] * sin[:, None]).mean(dim=0).T  # column j: e_j turned, averaged
    k, v = keys[kv_head, n_sink:].double(), values[kv_head, n_sink:].double()
    per_q = []
    for h in range(kv_head * group, (kv_head + 1) * group):
        q = queries[h, n_sink:].double()
        mean, centred = q.mean(dim=0), q - q.mean(dim=0)
        cov = centred.T @ centred / q.shape[0]
        mean, cov = turn @ mean, turn @ cov @ turn.T
        per_q.append(torch.softmax(k @ mean / math.sqrt(d) + ((k @ cov) * k).sum(dim=-1) / d / 2, dim=0))
    scores = (torch.stack(per_q).mean(dim=0) * v.norm(dim=-1)).tolist()
    return [max(scores) + 1] * n_sink + scores


# -- the tests ------------------------------------------------------------------------------------


def test_the_pyramid_budgets_are_kvpress_formula_by_hand():
    """n = 100 at ratio 0.5, window 4, β 20, 30 layers: the pyramid's sum is 50 per layer on average, its most
    min(2 × 50 − 2.5, 100 − 4) = 96 and its least 2 × 50 − 96 = 4, falling (96 − 4) / 29 a layer. At 0.75 the least
    (25 / 20) is below the window: every layer keeps round(25)."""
    policy = Policy("pyramidkv", window_size=4)
    assert [policy.layer_budget(100, 0.5, layer, 30) for layer in (0, 1, 10, 28, 29)] == [96, 93, 64, 7, 4]
    assert {policy.layer_budget(100, 0.75, layer, 30) for layer in range(30)} == {25}
    assert Policy("snapkv").layer_budget(100, 0.35, 3, 30) == 65  # int(100 × 0.65): one count for every layer


def test_adakv_shares_a_layers_count_between_heads_by_hand():
    """Two heads of four rows, two kept a head on average, alpha 0.5: each head keeps its best row first (4 and 0.7),
    then the four lowest of the rest over both heads go (0.1, 0.5, 0.6, then head 0's 1): head 0 keeps three rows,
    head 1 one."""
    scores = torch.tensor([[4.0, 3.0, 2.0, 1.0], [0.5, 0.6, 0.7, 0.1]])
    held = select_per_head(scores, 2, 0.5)
    assert held.tolist() == [[True, True, True, False], [False, False, True, False]]


def test_lagkv_scores_by_hand():
    """One sink, partitions of 2 rows: rows 1–2 are scored against rows 3–4 (range 0 … 2 on both channels), so row 1
    scales to (0, 0) (spread 0) and row 2 to (0.5, 1) (spread 0.354): ranked within the partition, 0 and 1/2. The
    sink and the tail (the last partition and the row after it) score 1."""
    keys = torch.tensor([[9.0, 9.0], [0.0, 0.0], [1.0, 2.0], [0.0, 0.0], [2.0, 2.0], [5.0, 1.0]])[None]
    scores = Policy("lagkv", n_sink=1, lag_size=2).score(LayerInputs(keys, values=keys.clone()), 4)
    assert scores.tolist() == [[1.0, 0.0, 0.5, 1.0, 1.0, 1.0]]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    "name,params",
    [
        ("pyramidkv", {"window_size": 4, "kernel_size": 5}),
        ("adakv", {"window_size": 6, "kernel_size": 3, "alpha_safeguard": 0.3}),
        ("lagkv", {"lag_size": 4}),
        ("lagkv", {"lag_size": 64}),
        ("expected_attention", {"n_future_positions": 40}),
    ],
)
def test_kept_positions_after_the_prefill_equal_the_definition_and_decode_equals_masked_eager(
    family, name, params, tiny_model, tiny_model_dir, monkeypatch
):
    model, hf = tiny_model(family), hf_model(tiny_model_dir(family))
    ids = prompt_ids(model)
    n, layers, kv_heads = len(ids) - 1, model.info.layers, model.info.kv_heads
    policy = Policy(name, **params)
    run = EvictionRun(model, ids, policy, compression_ratio=0.5, max_new_tokens=STEPS)
    run.prefill()
    out, queries = prefill_of(hf, ids)
    group, held = model.info.gqa_group, list(range(n))
    for layer in range(layers):
        attention, cache = out.attentions[layer][0], out.past_key_values.layers[layer]
        keys, values = cache.keys[0], cache.values[0]
        if name == "adakv":
            scores = [
                snapkv_scores(attention, h, group, params["window_size"], params["kernel_size"])
                for h in range(kv_heads)
            ]
            expected = ada_kept(scores, n // 2, params["alpha_safeguard"])
        elif name == "lagkv":  # ranks within partitions tie by design: any top count of the scores is LagKV's
            for h in range(kv_heads):
                scores = lag_scores(keys[h], values[h], 4, params["lag_size"])
                kept = set(run.kept_positions(layer, h)) - {n}
                assert len(kept) == n // 2
                assert min(scores[p] for p in kept) >= max(scores[p] for p in set(held) - kept), (layer, h)
            continue
        else:
            count = policy.layer_budget(n, 0.5, layer, layers)  # by hand: test_the_pyramid_budgets_…
            expected = [
                top(
                    torch.tensor(
                        snapkv_scores(attention, h, group, params["window_size"], params["kernel_size"])
                        if name == "pyramidkv"
                        else expected_scores(hf, queries[layer], keys, values, h, 4, params["n_future_positions"])
                    ),
                    count,
                    held,
                )
                for h in range(kv_heads)
            ]
        for h in range(kv_heads):
            kept = set(run.kept_positions(layer, h)) - {n}  # n: the last prompt token, read after the eviction
            assert kept == expected[h], (
                f"layer {layer}, KV head {h}: kept {sorted(kept)}, expected {sorted(expected[h])}"
            )
    if name == "adakv":  # the layer's budget, shared unevenly
        counts = [len(run.kept_positions(layer, h)) - 1 for layer in range(layers) for h in range(kv_heads)]
        assert sum(counts) == layers * kv_heads * (n // 2)
        assert kv_heads == 1 or len(set(counts)) > 1
    if name == "pyramidkv":
        assert len(run.kept_positions(0, 0)) > len(run.kept_positions(layers - 1, 0))
    while not run.finished:
        run.step()
    assert_decode_matches(hf, run, monkeypatch)


def test_expected_attention_during_decode_reads_the_queries_since_the_last_eviction(
    tiny_model, tiny_model_dir, monkeypatch
):
    """DecodingPress around ExpectedAttention: every `interval` passes, the queries of those passes (the first
    n_sink of them left out) model the future ones, their rotation averaged from position `interval` on (the
    buffer's length, as kvpress counts it), and the target_size best rows stay."""
    model, hf = tiny_model("llama"), hf_model(tiny_model_dir("llama"))
    ids = prompt_ids(model)
    n = len(ids) - 1
    policy, budget = Policy("expected_attention", n_sink=1, n_future_positions=16), DecodeBudget(n - 4, interval=3)
    run = EvictionRun(model, ids, policy, budget=budget, max_new_tokens=5)
    run.prefill()
    while not run.finished:
        run.step()
    assert [bool(e) for e in run.steps[2].evictions] == [True] * model.info.layers
    # the first three passes read the whole cache: transformers' full pass over their inputs has their queries
    out, queries = prefill_of(hf, ids[:-1] + [s.input_id for s in run.steps[:3]] + [0])
    for layer in range(model.info.layers):
        cache = out.past_key_values.layers[layer]
        keys, values = cache.keys[0][:, : n + 3], cache.values[0][:, : n + 3]
        for h in range(model.info.kv_heads):
            scores = expected_scores(hf, queries[layer][:, n : n + 3], keys, values, h, 1, 16)
            # rows before the eviction in position order: the positions' own order
            kept = set(run.steps[2].evictions[layer].positions[h, run.steps[2].evictions[layer].kept_rows[h]].tolist())
            assert kept == top(torch.tensor(scores), n - 4, list(range(n + 3)))
    assert_decode_matches(hf, run, monkeypatch)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize(
    ("policy", "settings"),
    [
        (Policy("adakv", window_size=4), dict(compression_ratio=0.5)),
        (Policy("pyramidkv", window_size=4), dict(compression_ratio=0.5)),
        (Policy("knorm"), dict(budget=DecodeBudget(12, 3))),
        (None, dict(budget=StreamingWindow(2, 8))),
        (None, {}),
    ],
)
def test_a_text_forced_through_the_cache_reads_as_the_run_reads_it_pass_by_pass(family, policy, settings, tiny_model):
    """forced_nll after a prefill's eviction reads the text in one pass over the kept rows; it equals an EvictionRun
    fed the text pass by pass (tested against transformers in tests/test_eviction.py), and with nothing evicted the
    full cache's NLL of the same tokens."""
    model = tiny_model(family)
    ids = prompt_ids(model)
    prompt, text = ids[:18], ids[18:]
    nll = forced_nll(model, prompt, text, policy, **settings)
    run = EvictionRun(model, prompt, policy, max_new_tokens=len(text), **settings)
    logits = [run.prefill().logits] + [run.step(input_id=token).logits for token in text[:-1]]
    by_pass = F.cross_entropy(torch.stack(logits), torch.tensor(text), reduction="none")
    assert nll.shape == (len(text),) and torch.allclose(nll, by_pass, atol=1e-5), (nll - by_pass).abs().max()
    if policy is None and not settings:
        assert torch.allclose(nll, stream_nll(model, ids)[len(prompt) - 1 :], atol=1e-5)
    else:
        assert not torch.allclose(nll, stream_nll(model, ids)[len(prompt) - 1 :], atol=1e-3), "nothing was evicted"


@pytest.mark.parametrize(
    "make",
    [
        lambda m, ids: EvictionRun(m, ids, Policy("pyramidkv"), budget=DecodeBudget(8, 4)),
        lambda m, ids: EvictionRun(m, ids, Policy("adakv", window_size=4), compression_ratio=0.5, rerotate=True),
        lambda m, ids: Policy("adakv", alpha_safeguard=1.5),
        lambda m, ids: Policy("lagkv", lag_size=0),
        lambda m, ids: EvictionRun(m, ids[:4], Policy("expected_attention", n_sink=4), compression_ratio=0.5).prefill(),
        lambda m, ids: EvictionRun(m, ids, Policy("expected_attention"), budget=DecodeBudget(8, 4)),
        lambda m, ids: forced_nll(m, ids[:6], ids[6:9], Policy("knorm"), budget=DecodeBudget(4, 2), one_pass=True),
        lambda m, ids: forced_nll(m, ids[:6], []),
    ],
)
def test_bad_settings_raise_a_clear_error(make, tiny_model):
    model = tiny_model("llama")
    with pytest.raises(InvalidSettingError):
        make(model, prompt_ids(model))

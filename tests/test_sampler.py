"""Sampling: the same filters as transformers' logits processors (ties included), and seeded draws."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

import engine
from engine.sampler import MAX_SEED, TEMPERATURE_FLOOR, apply_top_k, apply_top_p, filter_logits, sample
from tests.runs import decode

# Few distinct values over a small vocabulary, so ties at the filter boundaries are common.
tied_logits = st.lists(st.integers(-4, 4), min_size=2, max_size=40).map(
    lambda xs: torch.tensor(xs, dtype=torch.float32) / 2
)


def hf_filter(logits, temperature, top_k, top_p):
    processors = LogitsProcessorList()
    if temperature not in (0, 1):
        processors.append(TemperatureLogitsWarper(temperature))
    if top_k:
        processors.append(TopKLogitsWarper(top_k))
    if top_p < 1:
        processors.append(TopPLogitsWarper(top_p))
    return processors(torch.zeros(1, 1, dtype=torch.long), logits[None].clone())[0]


@settings(max_examples=300, deadline=None)
@given(logits=tied_logits, top_k=st.integers(1, 45))
def test_top_k_equals_transformers_with_ties(logits, top_k):
    assert torch.equal(apply_top_k(logits, top_k), hf_filter(logits, 1, top_k, 1))


@settings(max_examples=300, deadline=None)
@given(logits=tied_logits, top_p=st.floats(0.01, 0.99))
def test_top_p_equals_transformers_with_ties(logits, top_p):
    assert torch.equal(apply_top_p(logits, top_p), hf_filter(logits, 1, 0, top_p))


@settings(max_examples=300, deadline=None)
@given(logits=tied_logits, temperature=st.floats(0.05, 3.0), top_k=st.integers(0, 45), top_p=st.floats(0.01, 1.0))
def test_filter_chain_equals_transformers_processors(logits, temperature, top_k, top_p):
    ours = filter_logits(logits, engine.Sampling(temperature=temperature, top_k=top_k, top_p=top_p)).top_p
    assert torch.equal(ours, hf_filter(logits, temperature, top_k, top_p))


def test_filtered_distributions_on_real_logits(embedded_model):
    logits = engine.Generation(embedded_model, "Once upon a time", max_new_tokens=2).prefill().logits
    sampling = engine.Sampling(temperature=0.7, top_k=50, top_p=0.9)
    stages = filter_logits(logits, sampling)
    assert torch.equal(stages.temperature, hf_filter(logits, 0.7, 0, 1))
    assert torch.equal(stages.top_k, hf_filter(logits, 0.7, 50, 1))
    assert torch.equal(stages.top_p, hf_filter(logits, 0.7, 50, 0.9))
    kept = torch.isfinite(stages.top_p).sum().item()
    assert 1 <= kept <= 50


def generate(model, sampling, steps=12):
    generation, traces = decode(model, "Once upon a time", sampling=sampling, max_new_tokens=steps)
    return generation.generated, traces


def test_same_seed_same_tokens_every_run(embedded_model):
    sampling = engine.Sampling(temperature=1.2, top_k=100, top_p=0.95, seed=7)
    first, _ = generate(embedded_model, sampling)
    torch.manual_seed(999)  # the global RNG plays no part
    second, _ = generate(embedded_model, sampling)
    assert first == second
    other, _ = generate(embedded_model, engine.Sampling(temperature=1.2, top_k=100, top_p=0.95, seed=8))
    assert other != first


def test_drawn_token_is_inside_the_filtered_set_and_candidates_add_up(embedded_model):
    _, traces = generate(embedded_model, engine.Sampling(temperature=1.5, top_k=20, top_p=0.8, seed=3))
    for trace in traces:
        drawn = [c for c in trace.candidates if c.token_id == trace.token_id]
        assert len(drawn) == 1 and drawn[0].p_top_p > 0
        assert sum(c.p_top_k > 0 for c in trace.candidates) <= 21
        raw = torch.softmax(trace.logits, dim=-1)
        for c in trace.candidates[:10]:
            assert abs(c.p_raw - raw[c.token_id].item()) < 1e-7
        assert [c.logit for c in trace.candidates[:10]] == sorted(
            (c.logit for c in trace.candidates[:10]), reverse=True
        )


def test_greedy_is_argmax_and_ignores_filters(embedded_model):
    tokens, traces = generate(embedded_model, engine.Sampling(temperature=0, top_k=3, top_p=0.5))
    for trace in traces:
        assert trace.token_id == int(trace.logits.argmax())
        assert trace.candidates[0].p_top_p == trace.candidates[0].p_raw


def test_the_smallest_temperature_and_largest_seed_sample_without_overflow():
    """The floor is sized for logits of ±1e4 (module docstring): divided by it they stay finite."""
    logits = torch.tensor([1e4, -1e4, 1e4 - 0.05, 0.0, float("-inf")])
    sampling = engine.Sampling(temperature=TEMPERATURE_FLOOR, seed=MAX_SEED)
    drawn = set()
    for step in (0, 1, 7, 2**40):  # seed × stride + step stays within torch's generator seeds
        token, stages = sample(logits, sampling, step)
        assert torch.isfinite(stages.temperature[:4]).all()
        assert torch.isfinite(torch.softmax(stages.top_p, dim=-1)).all()
        drawn.add(token)
    assert drawn <= {0, 2}

"""The warm-up leaves no trace (the costs themselves: tests/test_costs.py)."""

import engine
from engine.timing import warm_up


def greedy_tokens(model) -> list[int]:
    with engine.Generation(model, "Paged blocks hold K and V", max_new_tokens=5) as generation:
        generation.prefill()
        while not generation.finished:
            generation.step()
        return list(generation.generated)


def test_warm_up_runs_the_model_and_changes_nothing_a_session_sees(tiny_model):
    model = tiny_model("llama")
    before = greedy_tokens(model)
    assert warm_up(model) is model
    assert greedy_tokens(model) == before


def test_warm_up_stops_early_when_the_model_ends_its_answer(tiny_model):
    model = tiny_model("llama")
    saved = model.eos_ids
    model.eos_ids = set(range(model.info.vocab))  # every token ends the answer: a step would raise
    try:
        assert warm_up(model) is model
    finally:
        model.eos_ids = saved

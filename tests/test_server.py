"""Many requests served from one pool (engine/server.py): each request's greedy tokens and logits equal its own
`Generation` run alone, on every family, through chunked prefills, shared prefix blocks and preemption."""

import pytest
import torch

import engine
from engine.errors import InvalidSettingError
from engine.server import Server
from tests.conftest import FAMILIES

LOGIT_ATOL = 1e-4
SYSTEM = "You are a careful teacher. Answer in one short sentence."


def prompts(model) -> list[list[int]]:
    """Four prompts sharing a system prompt (several full blocks of 4), and one of its own."""
    encode = lambda text: model.tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    system = encode(SYSTEM)
    return [system + encode(q) for q in (" What is a cache?", " Why page memory?", " What is decode?")] + [
        encode("Keys and values, position by position")
    ]


def alone(model, ids: list[int], steps: int):
    generation = engine.Generation(model, ids, max_new_tokens=steps, capture=engine.NO_RECORD)
    logits, tokens = [], []
    trace = generation.prefill()
    while True:
        logits.append(trace.logits)
        tokens.append(trace.token_id)
        if len(tokens) == steps or trace.token_id in model.eos_ids:
            return tokens, logits
        trace = generation.step()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("num_blocks,budget", [(64, 512), (64, 12), (13, 512)])  # roomy; chunked; preempting
def test_each_served_request_equals_its_run_alone(family, num_blocks, budget, tiny_model):
    model = tiny_model(family)
    server = Server(model, num_blocks=num_blocks, block_size=4, max_num_seqs=3, max_num_batched_tokens=budget)
    requests = [server.add(ids, max_tokens=6) for ids in prompts(model)[:2]]
    logits = {r.id: [] for r in requests}
    reports = []
    while not server.finished:
        reports.append(server.step())
        if len(reports) == 2:  # later arrivals, while the first two run
            requests += [server.add(ids, max_tokens=6) for ids in prompts(model)[2:]]
            logits.update({r.id: [] for r in requests[2:]})
        for rid, row in server.logits.items():
            logits[rid].append(row)
    for request in requests:
        tokens, expected = alone(model, request.token_ids[: request.prompt_length], 6)
        assert request.generated == tokens, (family, request.id)
        for got, want in zip(logits[request.id], expected, strict=True):
            torch.testing.assert_close(got, want, atol=LOGIT_ATOL, rtol=0)
    if budget == 12:  # the first prompt is longer than the budget: its first step computes 12 of its tokens
        assert len(requests[0].token_ids) - 6 > 12 and reports[0].ran == ((0, 12, 0),)
    if num_blocks == 13:
        assert any(r.preempted for r in reports), "the tight pool preempted nobody: the case tests nothing"
    assert reports[-1].owners == {}, "a finished request kept blocks"


def test_shared_prefix_blocks_are_held_once_and_freed_at_the_last_owner(tiny_model):
    model = tiny_model("llama")
    server = Server(model, num_blocks=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=512)
    first = server.add(prompts(model)[0], max_tokens=3)
    server.step()
    second = server.add(prompts(model)[1], max_tokens=8)
    report = server.step()
    shared = [b for b, owners in report.owners.items() if set(owners) == {first.id, second.id}]
    assert shared and shared == list(first.block_table[: len(shared)]) == list(second.block_table[: len(shared)])
    assert report.ran[0][2] == 4 * len(shared), "the second request recomputed the shared blocks"
    while first.status != "finished":
        report = server.step()
    assert all(report.owners[b] == (second.id,) for b in shared), "freed before its last owner was done"
    while not server.finished:
        report = server.step()
    assert report.owners == {}


@pytest.mark.parametrize(
    "make",
    [
        lambda server, model: server.add([model.info.vocab], max_tokens=2),
        lambda server, model: server.add([5] * (model.info.context_limit - 1), max_tokens=2),
        lambda server, model: server.add([], max_tokens=2),
        lambda server, model: server.add([5, 6], max_tokens="2"),
        lambda server, model: server.add(["5"], max_tokens=2),
        lambda server, model: server.step(),
    ],
)
def test_bad_requests_raise_a_clear_error(make, tiny_model):
    model = tiny_model("llama")
    with pytest.raises(InvalidSettingError):
        make(Server(model, num_blocks=8, block_size=4), model)

"""The continuous-batching scheduler (engine/scheduler.py) on hand-made cases: prefix blocks stored once and freed at
their last owner, the first waiting request alone chunked, the latest admitted request preempted and recomputed to
the same tokens, bad settings refused. bench/nanovllm_peer.py checks thousands of random traces against
nano-vllm's own scheduler."""

import pytest

from engine.blocks import BlockManager
from engine.errors import InvalidSettingError
from engine.scheduler import FINISHED, RUNNING, WAITING, Request, Scheduler

EOS = 2
SYSTEM = [10, 11, 12, 13, 14, 15, 16, 17]  # two blocks of 4


def token_for(request: Request) -> int:
    """A deterministic next token (never EOS): what a model would give, the same however the request was run."""
    return 20 + (request.id * 31 + len(request.token_ids) * 7) % 50


def run_step(scheduler: Scheduler):
    step = scheduler.schedule()
    scheduler.finish_step(step, [token_for(r) for r in step.requests])
    return step


def test_a_shared_prefix_is_stored_once_and_freed_at_its_last_owner():
    scheduler = Scheduler(BlockManager(10, 4), max_num_seqs=8, max_num_batched_tokens=64, eos_ids={EOS})
    a, b = Request(0, SYSTEM + [1, 3, 4], max_tokens=5), Request(1, SYSTEM + [5, 6], max_tokens=1)
    scheduler.add(a)
    first = run_step(scheduler)
    assert first.prefill and first.tokens == [11] and first.cached == [0]
    scheduler.add(b)
    second = run_step(scheduler)  # a waiting request is prefilled before anyone decodes
    assert second.prefill and second.requests == [b]
    assert second.cached == [8] and second.tokens == [2], "the system prompt's two blocks are reused, not computed"
    shared = a.block_table[:2]
    assert b.status == FINISHED and b.block_table == []
    assert all(scheduler.block_manager.ref_count[i] == 1 for i in shared), (
        "a block b shared is freed while a still holds it"
    )
    while not scheduler.finished:
        run_step(scheduler)
    manager = scheduler.block_manager
    assert a.status == FINISHED and not manager.used and all(i in manager.free for i in shared)
    c = Request(2, SYSTEM + [7], max_tokens=1)
    scheduler.add(c)
    assert run_step(scheduler).cached == [8], "freed prefix blocks stay reusable until handed out again"


def test_only_the_first_waiting_request_is_chunked():
    scheduler = Scheduler(BlockManager(16, 4), max_num_seqs=8, max_num_batched_tokens=10, eos_ids={EOS})
    a, b = Request(0, list(range(30, 45)), max_tokens=2), Request(1, [50, 51, 52, 53], max_tokens=2)
    scheduler.add(a)
    scheduler.add(b)
    first = run_step(scheduler)
    assert (first.prefill, first.requests, first.tokens) == (True, [a], [10])
    assert a.status == WAITING and a.generated == [], "a chunk that does not end the prompt makes no token"
    second = run_step(scheduler)
    assert (second.prefill, second.requests, second.tokens, second.cached) == (True, [a, b], [5, 4], [10, 0])
    assert a.status == b.status == RUNNING and len(a.generated) == len(b.generated) == 1
    third = run_step(scheduler)
    assert (third.prefill, third.requests, third.tokens) == (False, [a, b], [1, 1])


def test_a_full_pool_preempts_the_latest_admitted_and_recomputes_it_to_the_same_tokens():
    def answers(num_blocks):
        scheduler = Scheduler(BlockManager(num_blocks, 2), max_num_seqs=8, max_num_batched_tokens=64, eos_ids={EOS})
        requests = [Request(i, [40 + i, 41, 42], max_tokens=4, ignore_eos=True) for i in range(2)]
        for request in requests:
            scheduler.add(request)
        steps = []
        while not scheduler.finished:
            steps.append(run_step(scheduler))
        return [r.generated for r in requests], steps

    ample, ample_steps = answers(16)
    tight, tight_steps = answers(4)
    assert not any(s.preempted for s in ample_steps)
    preempting = next(s for s in tight_steps if s.preempted)
    assert [r.id for r in preempting.preempted] == [1] and [r.id for r in preempting.requests] == [0], (
        "the most recently admitted request is the one preempted"
    )
    later = tight_steps[tight_steps.index(preempting) + 1 :]
    back = next(s for s in later if any(r.id == 1 for r in s.requests))
    assert back.prefill and back.requests[0].id == 1, "it comes back first, as a prefill"
    assert back.cached[0] + back.tokens[0] == 3 + 2, "it reads its prompt and its answer so far again"
    assert tight == ample


@pytest.mark.parametrize(
    "make",
    [
        lambda: Request(0, [], max_tokens=1),
        lambda: Request(0, [5], max_tokens=0),
        lambda: Scheduler(BlockManager(0, 4), max_num_seqs=1, max_num_batched_tokens=8, eos_ids=set()),
        lambda: Scheduler(BlockManager(2, 4), max_num_seqs=1, max_num_batched_tokens=8, eos_ids=set()).add(
            Request(0, list(range(9)), max_tokens=1)
        ),
    ],
)
def test_bad_settings_raise_a_clear_error(make):
    with pytest.raises(InvalidSettingError):
        make()

"""The app's per-session run, without Streamlit."""

import gc
import threading
import weakref

import pytest
import torch

import engine
from tests.helpers import Clock
from ui.runs import turns
from ui.runs.classroom import ClassroomCache
from ui.runs.run import RunConfig
from ui.runs.runner import Runner
from ui.runs.store import RunStore
from ui.views.cases import CASE_BLOCK_SIZE, CASE_CACHED, CASES


def config(prompt="Rows grow one step at a time", **changes):
    values = dict(
        prompt=prompt,
        chat=False,
        sampling=engine.Sampling(temperature=1.0, seed=4),
        block_size=4,
        kv_splits=1,
        policy="radix",
        max_new_tokens=40,
        max_prompt_tokens=200,
    )
    return RunConfig(**{**values, **changes})


def test_heatmap_grown_from_decode_rows_equals_a_fresh_computation(tiny_model, monkeypatch):
    model = tiny_model("llama")
    runner = Runner(model, cache_tokens=256, keep_full_traces=8)
    prefills = []
    original = model.full_attention
    monkeypatch.setattr(model, "full_attention", lambda *a, **k: prefills.append(a) or original(*a, **k))
    runner.configure(config())
    runner.advance_to(2)
    runner.full_attention(2, layer=1, head=3)  # computed once by a prefill
    for step in range(3, 12):
        runner.advance_to(step)
        grown = runner.full_attention(step, layer=1, head=3)  # grown by one recorded row
        n = len(runner.prompt_ids) + step - 1
        fresh = original((runner.prompt_ids + runner.generation.generated)[:n], 1, 4)
        assert grown[0].shape == (n, n)
        torch.testing.assert_close(grown[0], fresh[0][3], atol=1e-6, rtol=0)
        torch.testing.assert_close(grown[1], fresh[1][3], atol=1e-5, rtol=0)
    assert len(prefills) == 1  # every later step added a row instead of recomputing
    back = runner.full_attention(5, layer=1, head=3)  # stepping back slices what is there
    assert back[0].shape == (len(runner.prompt_ids) + 4,) * 2


def test_a_new_prompt_publishes_the_old_one(tiny_model):
    runner = Runner(tiny_model("llama"), cache_tokens=256)
    runner.configure(config("first prompt here"))
    runner.advance_to(1)
    runner.configure(config("first prompt here, extended"))
    assert runner.history.prompts == [runner.model.tokenizer.encode("first prompt here")]
    assert runner.policy_reuse()["radix"].reused_tokens > 0


def test_back_past_the_kept_traces_is_one_forward_pass(tiny_model, monkeypatch):
    from tests.test_kv_cache import assert_same_state, assert_same_trace, counting_forwards, pool_state

    model = tiny_model("llama")
    keeps_all = Runner(model, cache_tokens=256, keep_full_traces=64)
    keeps_all.configure(config(kv_splits=3))
    runner = Runner(model, cache_tokens=256, keep_full_traces=4)
    runner.configure(config(kv_splits=3))
    assert keeps_all.advance_to(30) == runner.advance_to(30) == 30
    assert runner.generation.traces[4].is_slim
    before = pool_state(runner.generation)
    calls = counting_forwards(monkeypatch)
    back = runner.trace(5)
    assert runner.trace(5) is back  # the page's reruns at that step reuse it
    assert len(calls) == 1  # not a replay from the prefill
    assert_same_trace(back, keeps_all.trace(5))
    assert_same_state(before, pool_state(runner.generation))
    prefill = runner.trace(1)
    assert prefill.phase == "prefill" and len(calls) == 2  # the prefill too: one more pass
    assert_same_trace(prefill, keeps_all.trace(1))


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_the_busy_pool_goes_forward_one_pass_a_step_and_back_with_none(tiny_model, family, monkeypatch):
    """Every step's picture equals a replay made from scratch for that step (Gemma 3's window slides here), and
    stepping back to a step any page drew computes nothing."""
    from engine.busy_pool import BusyPoolReplay
    from tests.test_kv_cache import counting_forwards

    model = tiny_model(family)
    runner = Runner(model, cache_tokens=512, keep_full_traces=64)
    runner.configure(config("Paged attention stores the cache in blocks of four", block_size=2))
    runner.advance_to(12)
    generation = runner.generation
    calls = counting_forwards(monkeypatch)
    runner.busy_pool(3)
    assert len(calls) == 3  # the prefill and two decode steps
    for step in range(4, 13):
        runner.busy_pool(step)
        assert len(calls) == step  # one pass further
    monkeypatch.undo()
    for step in (12, 7, 1, 0):
        calls = counting_forwards(monkeypatch)
        picture = runner.busy_pool(step)
        assert calls == []  # back: no forward pass
        monkeypatch.undo()
        passes = [(generation.prompt_ids, list(range(len(generation.prompt_ids))))]
        passes += [(t.input_ids, t.positions) for t in generation.traces[1 : max(1, step)]]
        length = sum(len(ids) for ids, _ in passes)
        capacity = len(generation.prompt_ids) + runner.config.max_new_tokens  # the pool the runner's replay sized
        fresh = BusyPoolReplay(model, passes, 2, capacity).picture(lambda layer: runner.cached_kv(layer, length))
        assert (picture.block_table, picture.length, picture.others, picture.freed) == (
            fresh.block_table,
            fresh.length,
            fresh.others,
            fresh.freed,
        )
        assert picture.kv_max_diff == fresh.kv_max_diff == 0


# -- classroom mode: blocks come back, pools are bounded, students do not wait for each other --------


def test_a_dropped_runner_gives_its_classroom_blocks_back(tiny_model):
    model = tiny_model("llama")
    classroom = ClassroomCache(model, tokens=256)
    gone = Runner(model, cache_tokens=256, runs=classroom)
    gone.configure(config())
    gone.advance_to(4)
    pool = gone.generation.pool
    assert pool.block_manager.used > 0
    del gone  # what Streamlit does when the browser session ends: its state is dropped
    gc.collect()
    other = Runner(model, cache_tokens=256, runs=classroom)
    other.configure(config("another student"))  # the next use of the class's cache
    assert pool.block_manager.used == 0


def test_a_full_pool_first_takes_back_the_blocks_of_runners_held_in_reference_cycles(tiny_model):
    model = tiny_model("llama")
    prompts = ["one long prompt about caches " * 6, "another long prompt about paging " * 6]
    blocks = max(-(-len(model.tokenizer.encode(p)) // 4) for p in prompts)
    classroom = ClassroomCache(model, tokens=4 * (blocks + blocks // 2))  # room for one run, not two
    gc.disable()  # the collector must not run by chance: only a full pool makes the class run it
    try:
        gone = Runner(model, cache_tokens=256, runs=classroom)
        gone.configure(config(prompts[0]))
        gone.advance_to(1)
        gone.itself = gone  # a cycle, as a Streamlit session's state may sit in
        del gone
        other = Runner(model, cache_tokens=256, runs=classroom)
        other.configure(config(prompts[1]))
        assert other.advance_to(1) == 1
    finally:
        gc.enable()


def test_an_expired_lease_gives_blocks_back_and_the_run_is_rebuilt_on_return(tiny_model):
    model = tiny_model("llama")
    clock = Clock(0.0)
    classroom = ClassroomCache(model, tokens=256, lease_seconds=600, clock=clock)
    away = Runner(model, cache_tokens=256, runs=classroom)
    away.configure(config())
    away.advance_to(5)
    tokens, pool = list(away.generation.generated), away.generation.pool
    present = Runner(model, cache_tokens=256, runs=classroom)
    present.configure(config("another student"))
    present.advance_to(1)
    held_by_present = len(present.generation.table.blocks)
    assert pool.block_manager.used > held_by_present
    clock.now = 400
    present.advance_to(2)  # within the lease: nothing is closed
    assert not away.generation.closed
    clock.now = 1001  # `away` last seen at 0, `present` at 400
    present.advance_to(3)
    assert away.generation.closed and not present.generation.closed
    assert pool.block_manager.used == len(present.generation.table.blocks)  # only the present student's blocks
    assert away.advance_to(5) == 5  # back: rebuilt from its settings, the same tokens
    assert away.generation.generated == tokens and not away.generation.closed
    assert pool.block_manager.used > len(present.generation.table.blocks)


def test_the_class_keeps_a_few_pools_and_drops_the_least_recently_used(tiny_model):
    model = tiny_model("llama")
    classroom = ClassroomCache(model, tokens=256, max_caches=2)
    runner = Runner(model, cache_tokens=256, runs=classroom)
    runner.configure(config(block_size=4))
    first = weakref.ref(runner.cache)
    kept = classroom.get("radix", 8)
    classroom.get("radix", 16)
    assert classroom.kept == [("radix", 8), ("radix", 16)]
    assert first() is runner.generation.prefix_cache  # dropped from the class, alive while its run uses it
    runner.advance_to(2)
    assert classroom.get("radix", 8) is kept  # a kept pool is reused, and becomes the most recent
    assert classroom.kept == [("radix", 16), ("radix", 8)]
    runner.configure(config(block_size=8))  # the run moves on: nothing holds the dropped pool now
    gc.collect()
    assert first() is None
    assert runner.cache is kept


def test_a_step_completes_while_another_students_forward_pass_runs(tiny_model, monkeypatch):
    model = tiny_model("llama")
    classroom = ClassroomCache(model, tokens=512)
    stepping = Runner(model, cache_tokens=256, runs=classroom)
    stepping.configure(config("a short prompt"))
    stepping.advance_to(1)
    prefilling = Runner(model, cache_tokens=256, runs=classroom)
    prefilling.configure(config("a long prompt that another student is prefilling right now"))
    inside, release, held = threading.Event(), threading.Event(), []
    original = engine.Model.forward

    def forward(self, *args, **kwargs):
        if threading.current_thread() in held:  # hold the first student inside its forward pass
            inside.set()
            release.wait(60)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(engine.Model, "forward", forward)
    first = threading.Thread(target=prefilling.advance_to, args=(1,))
    held.append(first)
    first.start()
    try:
        assert inside.wait(60)
        second = threading.Thread(target=stepping.advance_to, args=(2,))
        second.start()
        second.join(20)  # deadlock detection, not a timing bound: the step takes milliseconds
        assert not second.is_alive(), "a step waited for another student's forward pass"
        assert stepping.generated == 2
    finally:
        release.set()
        first.join(60)
    assert prefilling.generated == 1


def test_split_demo_replays_a_recorded_step_in_splits(tiny_model):
    """At kv_splits = 1 the Split-KV view replays the split maths over a step's recorded scores and cached V:
    the merge equals the step's own attention output (probs @ V) and what the model computes in 4 splits."""
    model = tiny_model("llama")
    unsplit, in_splits = Runner(model, cache_tokens=256), Runner(model, cache_tokens=256)
    unsplit.configure(config())
    in_splits.configure(config(kv_splits=4))
    unsplit.advance_to(6)  # the demo of an earlier step reads only the positions that step had cached
    in_splits.advance_to(3)
    layer, head = 1, model.info.q_heads - 1  # the last Q head reads the last K/V head
    trace = unsplit.trace(3)
    demo = unsplit.split_demo(trace, layer, head)
    assert len(demo.ranges) == 4 and demo.ranges[-1][1] == trace.context_length
    _, v, _ = unsplit.cached_kv(layer, trace.context_length)
    attended = trace.attention[layer, head, -1].double() @ v[:, head // model.info.gqa_group].double()
    torch.testing.assert_close(demo.merged[0, 0], demo.unsplit[0, 0], atol=1e-6, rtol=0)
    torch.testing.assert_close(demo.merged[0, 0], attended, atol=1e-6, rtol=0)
    ran = in_splits.trace(3).split
    torch.testing.assert_close(demo.weight[0, 0].float(), ran.weight[layer, head], atol=1e-5, rtol=0)
    torch.testing.assert_close(demo.merged[0, 0].float(), ran.merged[layer, head], atol=1e-5, rtol=0)


# -- the article's prefix-cache cases: the same result however often they are opened ----------------------


def case_expectation(tokenizer, case: str) -> dict[str, int]:
    """The article's rules on the case's token ids, written out here: the shared prefix of the cached prompt and
    the edit; the whole-prompt rule reuses all of the cached prompt or nothing, the block policy whole blocks of
    4, the radix tree every shared token (each at most n − 1: the last token is computed for its logits)."""
    cached, new = tokenizer.encode(CASE_CACHED), tokenizer.encode(CASES[case])
    first = 0
    while first < min(len(cached), len(new)) and cached[first] == new[first]:
        first += 1
    shared = min(first, len(new) - 1)
    return {
        "first": first,
        "whole": len(cached) if first == len(cached) else 0,
        "block": shared - shared % CASE_BLOCK_SIZE,
        "radix": shared,
    }


def open_case(runner: Runner, case: str, policy: str) -> None:
    """What the page does for a case button, chapter or link: the cached prompt alone, then the edit's prefill."""
    runner.publish_alone(config(CASE_CACHED, block_size=CASE_BLOCK_SIZE, policy=policy))
    runner.configure(config(CASES[case], block_size=CASE_BLOCK_SIZE, policy=policy))
    assert runner.advance_to(1) == 1


@pytest.mark.parametrize("policy", engine.REUSE_POLICIES)
def test_each_case_gives_the_articles_reuse_however_often_it_is_opened(tiny_model, policy):
    model = tiny_model("llama")
    runner = Runner(model, cache_tokens=256, runs=RunStore(10**9))
    expected = {case: case_expectation(model.tokenizer, case) for case in CASES}
    assert expected["case1"]["whole"] > 0 and expected["case2"]["whole"] == 0  # a hit and a miss, as the article
    others = [CASES["case2"], CASES["case1"] + "，再举一个", "Rows grow one step at a time", CASE_CACHED]
    for round_ in range(3):
        for turn, case in enumerate(("case2", "case1")):
            # the page's own prompts first: the edit itself, a longer copy of it, an unrelated one, the cached one
            runner.configure(config(others[(2 * round_ + turn) % len(others)], block_size=CASE_BLOCK_SIZE))
            runner.advance_to(2)
            open_case(runner, case, policy)
            want = expected[case]
            reuse = runner.policy_reuse()
            assert {p: reuse[p].reused_tokens for p in ("whole", "block", "radix")} == {
                p: want[p] for p in ("whole", "block", "radix")
            }, (round_, case)
            cached, first = runner.closest_cached()
            assert cached == model.tokenizer.encode(CASE_CACHED) and first == want["first"]
            assert runner.prefix_hit().reused_tokens == want[policy]  # the run's own cache did the same
            assert runner.history.prompts == [cached]


def test_a_case_opened_after_other_prompts_shares_the_run_of_a_fresh_page(tiny_model):
    model = tiny_model("llama")
    runs = RunStore(10**9)
    busy, fresh = Runner(model, cache_tokens=256, runs=runs), Runner(model, cache_tokens=256, runs=runs)
    for prompt in (CASES["case2"], "Rows grow one step at a time"):
        busy.configure(config(prompt, block_size=CASE_BLOCK_SIZE))
        busy.advance_to(1)
    open_case(busy, "case2", "radix")
    open_case(fresh, "case2", "radix")
    assert busy.run is fresh.run  # the same seeds (the cached prompt alone): one run for both pages
    assert busy.run.seeds == (tuple(model.tokenizer.encode(CASE_CACHED)),)
    busy.configure(config("Rows grow one step at a time", block_size=CASE_BLOCK_SIZE))
    fresh.configure(config("Rows grow one step at a time", block_size=CASE_BLOCK_SIZE))
    assert busy.run is fresh.run  # both published the case's edit after the cached prompt


def test_a_link_opened_late_hands_its_garbage_back_and_a_press_does_not(tiny_model, monkeypatch):
    """Opening a link at a late step computes its steps in one go and then trims the heap (ui.host.memory); one press,
    or a short walk, never does: a trim locks every allocation for a moment."""
    from ui.host import memory
    from ui.runs import runner as runner_module

    trims = []
    monkeypatch.setattr(memory, "release_free_memory", lambda: trims.append(True) or True)
    runner = Runner(tiny_model("llama"), cache_tokens=256)
    runner.configure(config(max_new_tokens=60))
    late = runner_module.CATCH_UP_STEPS + 2
    runner.advance_to(late - 1)  # the link's steps, all at once
    assert len(trims) == 1
    runner.advance_to(late)  # a press
    for step in range(late + 1, late + 6):  # a short walk
        runner.advance_to(step)
    assert len(trims) == 1
    runner.advance_to(late + 5)  # already computed: nothing to do
    assert len(trims) == 1


def test_a_prefill_gives_way_between_two_layers_to_a_press_that_waits(tiny_model, monkeypatch):
    """A page's prefill shares its turn between layers (a 700-token prefill holds one core for seconds): a press
    waiting for a turn draws before the prefill's pass ends, and the prefill's numbers are those of a pass alone."""
    model = tiny_model("llama")
    monkeypatch.setattr(turns, "EXPLORERS", 1)
    monkeypatch.setattr(turns, "SHORT_SECONDS", 0.0)  # no short lane: the press waits for the prefill's turn
    ticks = iter(range(10**6))
    monkeypatch.setattr(turns, "clock", lambda: float(next(ticks)))  # every check is a second later: it shares
    runner = Runner(model, cache_tokens=256)
    runner.configure(config())
    holding, go, seen, press_done = (threading.Event() for _ in range(4))
    traces_seen = []

    def prefill_page():
        with turns.turn(turns.EXPLORER):
            holding.set()
            assert go.wait(5)
            runner.advance_to(1)

    def press():
        with turns.turn(turns.EXPLORER):
            traces_seen.append(len(runner.generation.traces))
            seen.set()
            assert press_done.wait(5)

    prefilling = threading.Thread(target=prefill_page, daemon=True)
    prefilling.start()
    assert holding.wait(5)
    pressing = threading.Thread(target=press, daemon=True)
    pressing.start()
    with turns._changed:  # noqa: SLF001 — the press waits for a turn
        assert turns._changed.wait_for(lambda: turns._lines[turns.EXPLORER], 5)  # noqa: SLF001
    go.set()
    assert seen.wait(5)
    assert traces_seen == [0]  # the press drew while the prefill's pass was under way
    press_done.set()
    prefilling.join(5)
    pressing.join(5)
    assert len(runner.generation.traces) == 1
    alone = engine.Generation(model, config().prompt, sampling=config().sampling, block_size=4, max_new_tokens=40)
    assert torch.equal(runner.generation.traces[0].logits, alone.prefill().logits)
    alone.close()

"""Prefix caching under the three policies: what is reused, that reuse is exact, and eviction."""

import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engine
from engine.prefix_cache import PrefixCache, PromptHistory

CASE_CACHED = "解释什么是Transformer"
CASE_1 = "解释什么是Transformer，举个例子"
CASE_2 = "解释什么是大语言模型"


def expected_reuse(policy, cached, new, block_size):
    """Each policy's rule, written from docs/engine-api.md, for one cached prompt and one new prompt."""
    e = 0
    while e < min(len(cached), len(new)) and cached[e] == new[e]:
        e += 1
    if policy == "block":
        return min(e, len(new) - 1) // block_size * block_size
    if policy == "radix":
        return min(e, len(new) - 1)
    return min(len(cached), len(new) - 1) if e == len(cached) else 0  # whole: only an entire earlier prompt


def prefill_then_close(model, cache, prompt, steps=0):
    generation = engine.Generation(model, prompt, prefix_cache=cache, max_new_tokens=steps + 1)
    trace = generation.prefill()
    for _ in range(steps):
        generation.step()
    generation.close()
    return trace


@pytest.mark.parametrize("policy", ["block", "radix", "whole"])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_reuse_follows_each_policy_rule(policy, block_size, tiny_model):
    model = tiny_model("llama")
    a = list(range(1000, 1040))  # 40 tokens
    cases = [a[:e] + [7, 8, 9, 10, 11][: 1 + e % 5] for e in (0, 3, 4, 15, 16, 17, 33)]
    cases += [a + [5, 6, 7], a, a[:20], a[:31] + [9] * 30]
    for b in cases:
        cache = PrefixCache(model, policy=policy, block_size=block_size)
        prefill_then_close(model, cache, a, steps=2)
        trace = prefill_then_close(model, cache, b)
        expected = expected_reuse(policy, a, b, block_size)
        assert trace.prefix.reused_tokens == expected, (policy, len(b))
        assert trace.prefix.computed_tokens == len(b) - expected == len(trace.input_ids)
        assert trace.positions[0] == expected
        hits = trace.prefix.hits
        if policy == "block":
            assert len(hits) == -(-len(b) // block_size) and sum(hits) * block_size == expected
        else:
            assert hits == [p < expected for p in range(len(b))]


@pytest.mark.parametrize("block_size", [4, 16])
def test_source_article_cases_on_the_embedded_tokenizer(block_size, tiny_model, tokenizer):
    model = tiny_model("llama")  # tiny weights, but the embedded model's tokenizer
    cached, case1, case2 = (tokenizer.encode(t) for t in (CASE_CACHED, CASE_1, CASE_2))
    reuse = {}
    for policy in ("block", "radix", "whole"):
        for name, new in (("case1", case1), ("case2", case2)):
            cache = PrefixCache(model, policy=policy, block_size=block_size)
            prefill_then_close(model, cache, cached)
            trace = prefill_then_close(model, cache, new)
            assert trace.prefix.reused_tokens == expected_reuse(policy, cached, new, block_size)
            reuse[policy, name] = trace.prefix.reused_tokens
    # Case 1 extends the cached prompt: the article's rule reuses all of it.
    assert reuse["whole", "case1"] == len(cached) == reuse["radix", "case1"]
    # Case 2 edits it: the article's rule reuses nothing, SGLang every token before the edit.
    assert reuse["whole", "case2"] == 0
    assert reuse["radix", "case2"] > 0


@pytest.mark.parametrize("policy", ["block", "radix", "whole"])
def test_prefix_hit_logits_equal_cold_run(policy, tiny_model):
    model = tiny_model("qwen3")
    a = list(range(2000, 2030))
    b = a[:22] + list(range(3000, 3013))  # 22 shared tokens: not a multiple of the block size
    c = a + [42, 43, 44]  # extends all of a
    cache = PrefixCache(model, policy=policy, block_size=4)
    prefill_then_close(model, cache, a, steps=3)
    for prompt in (b, c):
        warm = engine.Generation(model, prompt, prefix_cache=cache, max_new_tokens=12)
        cold = engine.Generation(model, prompt, max_new_tokens=12)
        pairs = [(warm.prefill(), cold.prefill())]
        assert pairs[0][0].prefix.reused_tokens > 0 or policy == "whole" and prompt is b
        while not cold.finished:
            pairs.append((warm.step(), cold.step()))
        for w, c_ in pairs:
            assert w.token_id == c_.token_id
            assert (w.logits - c_.logits).abs().max().item() <= 1e-4
        warm.close()


def test_a_hit_shares_blocks_without_copying_whole_ones(tiny_model):
    model = tiny_model("llama")
    cache = PrefixCache(model, policy="radix", block_size=4)
    a = list(range(500, 520))
    first_blocks = prefill_then_close(model, cache, a).block_table
    second = engine.Generation(model, a[:10] + [1, 2, 3], prefix_cache=cache, max_new_tokens=1)
    trace = second.prefill()
    assert trace.prefix.reused_tokens == 10
    assert trace.prefix.shared_blocks == first_blocks[:2]  # positions 0–7, by reference
    assert len(trace.prefix.copied_blocks) == 1  # positions 8–9 copied into a block of its own
    assert second.table.blocks[:2] == first_blocks[:2]


def test_only_prompt_tokens_are_published_and_only_on_close(tiny_model):
    model = tiny_model("llama")
    cache = PrefixCache(model, policy="radix", block_size=4)
    a = list(range(600, 610))
    generation = engine.Generation(model, a, prefix_cache=cache, max_new_tokens=6)
    generation.prefill()
    for _ in range(5):
        generation.step()
    assert prefill_then_close(model, cache, a).prefix.reused_tokens == 0  # not published yet
    generated = list(generation.generated)
    generation.close()
    trace = prefill_then_close(model, cache, a + generated)
    assert trace.prefix.reused_tokens == len(a)  # the answer's K/V is not shared


def test_reclaiming_keeps_in_use_blocks_and_forgets_reclaimed_ones(tiny_model):
    model = tiny_model("llama")
    cache = PrefixCache(model, policy="block", block_size=2, capacity_blocks=8)
    a, b = [11, 12, 13, 14, 15], [21, 22, 23, 24, 25]
    first = engine.Generation(model, a, prefix_cache=cache, max_new_tokens=1)
    first.prefill()
    a_blocks = list(first.table.blocks)
    first.close()  # publishes a's 2 full blocks; all 3 go to the back of the free list, last first
    prefill_then_close(model, cache, b)  # then b's, behind a's
    assert cache.cached_blocks == 4
    holder = engine.Generation(model, b + [1], prefix_cache=cache, max_new_tokens=8)
    holder.prefill()  # b's 2 cached blocks are in use again, plus one new block
    held = set(holder.table.blocks)
    hog = engine.Generation(model, [31, 32, 33, 34, 35, 36, 37], prefix_cache=cache, max_new_tokens=2)
    trace = hog.prefill()  # 4 blocks from the front: the never-used one, then a's, given back last first
    assert trace.reclaimed_blocks == [a_blocks[1], a_blocks[0]], "a's tail goes before its head"
    assert not held & set(trace.reclaimed_blocks), "nothing in use is reclaimed"
    assert [e.block for e in cache.reclaims] == trace.reclaimed_blocks
    hog.close()
    assert prefill_then_close(model, cache, a).prefix.reused_tokens == 0  # a's blocks hold other K/V now
    holder.close()
    assert prefill_then_close(model, cache, b + [9]).prefix.reused_tokens == 4  # b survived while in use
    too_big = engine.Generation(model, list(range(100, 120)), prefix_cache=cache, max_new_tokens=2)
    with pytest.raises(engine.CacheFullError):
        too_big.prefill()  # 10 blocks > 8
    too_big.close()
    assert cache.pool.block_manager.used == 0


def test_recently_hit_blocks_are_evicted_last(tiny_model):
    model = tiny_model("llama")
    cache = PrefixCache(model, policy="radix", block_size=2, capacity_blocks=6)
    a, b = [11, 12, 13, 14], [21, 22, 23, 24]
    prefill_then_close(model, cache, a)
    prefill_then_close(model, cache, b)
    assert prefill_then_close(model, cache, a + [5]).prefix.reused_tokens == 4  # a is now more recent than b
    # Cached now: a's 2 blocks, b's 2, and the block holding a+[5]'s last token; 1 block is empty.
    trace = prefill_then_close(model, cache, [31, 32, 33, 34, 35])  # needs 3 blocks: the empty one, then b's
    assert len(trace.reclaimed_blocks) == 2
    assert prefill_then_close(model, cache, a + [6]).prefix.reused_tokens == 4
    assert prefill_then_close(model, cache, b + [6]).prefix.reused_tokens == 0


alphabet_prompts = st.lists(st.sampled_from([3, 4, 5]), min_size=1, max_size=9)
operation = st.one_of(
    st.tuples(st.just("open"), alphabet_prompts, st.integers(0, 3)), st.tuples(st.just("close"), st.integers(0, 5))
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(policy=st.sampled_from(["block", "radix", "whole"]), ops=st.lists(operation, min_size=1, max_size=25))
def test_pool_stays_consistent_over_random_sessions(policy, ops, tiny_model):
    model = tiny_model("llama")
    cache = PrefixCache(model, policy=policy, block_size=2, capacity_blocks=14)
    pool = cache.pool
    open_sessions = []
    cold_logits = {}
    for op in ops:
        if op[0] == "open" and len(open_sessions) < 2:
            _, prompt, steps = op
            generation = engine.Generation(model, prompt, prefix_cache=cache, max_new_tokens=steps + 1)
            try:
                trace = generation.prefill()
                for _ in range(steps):
                    generation.step()
            except engine.CacheFullError:
                generation.close()
                continue
            key = tuple(prompt)
            if key not in cold_logits:
                cold_logits[key] = engine.Generation(model, prompt, max_new_tokens=1).prefill().logits
            assert (trace.logits - cold_logits[key]).abs().max().item() <= 1e-4
            open_sessions.append(generation)
        elif op[0] == "close" and open_sessions:
            open_sessions.pop(op[1] % len(open_sessions)).close()
        # Invariants: counts add up, references match the open tables, in-use blocks are never free.
        users = [0] * pool.num_blocks
        for generation in open_sessions:
            for block in generation.table.blocks:
                users[block] += 1
        assert users == pool.block_manager.ref_count
        assert set(pool.block_manager.free) == {b for b in range(pool.num_blocks) if users[b] == 0}
        assert pool.block_manager.used + len(pool.block_manager.free) == pool.num_blocks
        assert all(
            pool.block_manager.ref_count[b]
            for b in range(pool.num_blocks)
            if cache.holds(b) and b not in pool.block_manager.free
        ), "a block the index finds is free or held"
    for generation in open_sessions:
        generation.close()
    assert pool.block_manager.used == 0


def test_predicted_reuse_matches_what_real_caches_reuse(tiny_model, tokenizer):
    model = tiny_model("llama")
    history = PromptHistory()
    for earlier in (CASE_CACHED, "解释什么是注意力"):
        history.add(tokenizer.encode(earlier))
    for new in (CASE_1, CASE_2, "解释什么是注意力机制"):
        ids = tokenizer.encode(new)
        predicted = history.predicted_reuse(ids, 4)
        for policy in ("block", "radix", "whole"):
            cache = PrefixCache(model, policy=policy, block_size=4)
            for earlier in history.prompts:
                prefill_then_close(model, cache, earlier)
            prefix = prefill_then_close(model, cache, ids).prefix
            assert prefix.reused_tokens == predicted[policy].reused_tokens, (new, policy)
            assert (prefix.unit, prefix.hits) == (predicted[policy].unit, predicted[policy].hits), (new, policy)


# -- a failed prefill or step changes nothing ------------------------------------------------------


def pool_state(cache, *prompts):
    """What a failed call must leave as it was: references, the free list in LRU order, and what each
    prompt would reuse."""
    pool = cache.pool
    return list(pool.block_manager.ref_count), list(pool.block_manager.free), [cache.lookup(p) for p in prompts]


def cold_logits(model, prompt):
    return engine.Generation(model, prompt, max_new_tokens=1).prefill().logits


@pytest.mark.parametrize("policy", ["radix", "block"])
def test_a_full_pool_after_a_hit_does_not_poison_the_cache(policy, tiny_model):
    model = tiny_model("llama")
    cache = PrefixCache(model, policy=policy, block_size=4, capacity_blocks=3)
    published = list(range(100, 110))
    prefill_then_close(model, cache, published)  # 3 blocks, now free and cached
    holder = engine.Generation(model, [7, 8], prefix_cache=cache, max_new_tokens=4)
    holder.prefill()  # takes 1 of the 3 blocks
    sharing = published[:8] + [300, 301, 302, 303]  # reuses 2 blocks, needs a third: none is left
    unrelated = published[:8] + [500, 501]
    generation = engine.Generation(model, sharing, prefix_cache=cache, max_new_tokens=4)
    before = pool_state(cache, published, sharing, unrelated)
    for _ in range(2):  # the retry is refused the same way while the pool is still full
        with pytest.raises(engine.CacheFullError, match="pool is full"):
            generation.prefill()
        assert (generation.table.blocks, generation.table.length, generation.generated, generation.traces) == (
            [],
            0,
            [],
            [],
        )
        assert pool_state(cache, published, sharing, unrelated) == before
    holder.close()
    trace = generation.prefill()  # room now: the retry equals a cold run
    assert trace.prefix.reused_tokens == 8
    assert (trace.logits - cold_logits(model, sharing)).abs().max().item() <= 1e-4
    generation.close()
    later = prefill_then_close(model, cache, unrelated)  # a bystander reusing the same 8 tokens
    assert later.prefix.reused_tokens == 8
    assert (later.logits - cold_logits(model, unrelated)).abs().max().item() <= 1e-4


class Fault:
    """Wraps a function so that its k-th next call raises `error` (`after`: once the call has run, so
    a forward pass has already written its K/V). countdown 0 = disarmed."""

    def __init__(self, real, error: Exception, after: bool = False):
        self.real, self.error, self.after, self.countdown = real, error, after, 0

    def __call__(self, *args, **kwargs):
        fire = self.countdown == 1
        self.countdown = max(0, self.countdown - 1)
        if fire and not self.after:
            raise self.error
        result = self.real(*args, **kwargs)
        if fire:
            raise self.error
        return result


SHARED = list(range(100, 112))
FAULT_PROMPTS = [SHARED[:10], SHARED[:8] + [300, 301, 302, 303], SHARED[:6] + [7], SHARED + [1, 2, 3], [9, 8, 7, 6, 5]]
MAX_STEPS = 3
session_operation = st.one_of(
    st.tuples(st.just("open"), st.integers(0, len(FAULT_PROMPTS) - 1)),  # and prefill
    st.tuples(st.just("advance"), st.integers(0, 5)),  # prefill if that failed, else step
    st.tuples(st.just("close"), st.integers(0, 5)),
    st.tuples(st.just("fail_allocation"), st.integers(1, 3)),  # the k-th next block allocation raises
    st.tuples(st.just("fail_forward"), st.integers(1, 2)),  # the k-th next forward pass raises after writing
)


@functools.cache
def cold_run(model, prompt: tuple[int, ...]) -> list:
    """The traces of a run without a prefix cache (the paged layout does not change them: test_kv_cache)."""
    reference = engine.Generation(model, list(prompt), max_new_tokens=MAX_STEPS + 1)
    return [reference.prefill()] + [reference.step() for _ in range(MAX_STEPS)]


def session_extent(generation):
    return (
        list(generation.table.blocks),
        generation.table.length,
        list(generation.generated),
        len(generation.traces),
        generation.text,
    )


def advanced(generation, cold) -> bool:
    """Prefill or step once; the result must equal the cold run's, a failure must leave no trace."""
    before = session_extent(generation)
    try:
        trace = generation.prefill() if not generation.traces else generation.step()
    except (engine.CacheFullError, RuntimeError):
        assert session_extent(generation) == before  # nothing of the failed call is left
        return False
    expected = cold[tuple(generation.prompt_ids)][trace.step]
    assert trace.token_id == expected.token_id
    assert (trace.logits - expected.logits).abs().max().item() <= 1e-4
    return True


def check_pool(cache, generations):
    """References match the open tables and in-use blocks are never free."""
    pool = cache.pool
    users = [0] * pool.num_blocks
    for generation in generations:
        assert len(generation.table.blocks) == -(-generation.table.length // pool.block_size)
        for block in generation.table.blocks:
            users[block] += 1
    assert users == pool.block_manager.ref_count
    assert set(pool.block_manager.free) == {b for b in range(pool.num_blocks) if users[b] == 0}
    # Forward passes run unlocked and write at positions ≥ their table's length, so a block that others
    # can read (another table's, or one the index finds) must lie wholly below that length.
    for generation in generations:
        for k, block in enumerate(generation.table.blocks):
            if users[block] > 1 or cache.holds(block):
                assert (k + 1) * pool.block_size <= generation.table.length


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    policy=st.sampled_from(["block", "radix", "whole"]),
    block_size=st.sampled_from([2, 4]),
    capacity=st.integers(3, 10),
    ops=st.lists(session_operation, min_size=1, max_size=30),
)
def test_forced_failures_never_yield_a_hit_that_differs_from_a_cold_run(
    policy, block_size, capacity, ops, tiny_model, monkeypatch
):
    model = tiny_model("llama")
    cold = {tuple(prompt): cold_run(model, tuple(prompt)) for prompt in FAULT_PROMPTS}  # before the faults
    cache = PrefixCache(model, policy=policy, block_size=block_size, capacity_blocks=capacity)
    generations = []
    with monkeypatch.context() as patch:
        allocation = Fault(cache.block_manager.allocate, engine.CacheFullError("forced: no block"))
        forward = Fault(engine.Model.forward, RuntimeError("forced: the forward pass failed"), after=True)
        patch.setattr(cache.block_manager, "allocate", allocation)
        patch.setattr(engine.Model, "forward", lambda self, *args, **kwargs: forward(self, *args, **kwargs))
        for op in ops:
            if op[0] in ("open", "advance") and (generations if op[0] == "advance" else len(generations) < 3):
                if op[0] == "open":
                    generations.append(
                        engine.Generation(model, FAULT_PROMPTS[op[1]], prefix_cache=cache, max_new_tokens=MAX_STEPS + 1)
                    )
                generation = generations[-1] if op[0] == "open" else generations[op[1] % len(generations)]
                for _ in range(2):  # a failed call is retried at once: it works, or is refused again
                    if generation.finished or advanced(generation, cold):
                        break
            elif op[0] == "close" and generations:
                generations.pop(op[1] % len(generations)).close()
            elif op[0] == "fail_allocation":
                allocation.countdown = op[1]
            elif op[0] == "fail_forward":
                forward.countdown = op[1]
            check_pool(cache, generations)
        for generation in generations:
            generation.close()
    assert cache.pool.block_manager.used == 0


def test_a_reclaim_that_cuts_a_radix_subtree_forgets_its_blocks_where_they_wait(tiny_model):
    """Reclaiming a radix node's block cuts the subtree below it: those blocks hold nothing findable any more, and
    they keep their places in the free list (nano-vllm's order: a block waits where it was given back)."""
    model = tiny_model("llama")
    cache = PrefixCache(model, policy="radix", block_size=2, capacity_blocks=6)
    free = cache.block_manager.free

    def run(prompt, hold=False):
        generation = engine.Generation(model, prompt, prefix_cache=cache, max_new_tokens=1)
        generation.prefill()
        if not hold:
            generation.close()
        return generation

    run([3, 4, 5])  # blocks: [3 4] [5]
    extended = run([3, 4, 5, 6, 7], hold=True)  # shares [3 4], copies [5] from its block (released at once)
    run([9, 9, 9])  # two more cached blocks, released after that source block
    extended.close()  # publishes [6 7] below [3 4 5] in the tree
    assert all(cache.holds(b) for b in free)  # every free block cached; the copied-from one first
    before = list(free)
    taken = run([8]).traces[0]  # takes the first free block, [5]'s: reclaiming it cuts the tree below [3 4]
    assert taken.reclaimed_blocks == [before[0]]
    assert list(free) == before[1:] + [before[0]], "no block moved but the one taken and given back"
    held = [cache.holds(b) for b in free]
    assert held.count(False) == 2  # [6 7]'s two blocks (the copy of [5] and [7]) are empty now
    assert len(cache.lookup([3, 4, 5, 6, 7, 8])) == 2, "only [3 4], above the cut, is found"


def test_predicted_reuse_gives_each_policy_its_hits_per_block_or_token():
    """The article's two cases in miniature: an 11-token cached prompt, extended (a whole-prompt hit) or
    edited at position 9 (a miss under the whole-prompt rule), with blocks of 4."""
    history = PromptHistory()
    history.add(cached := list(range(1, 12)))
    extended = history.predicted_reuse(cached + [50, 51], 4)
    assert {p: r.reused_tokens for p, r in extended.items()} == {"whole": 11, "block": 8, "radix": 11}
    assert extended["whole"].unit == "token" and extended["whole"].hits == [True] * 11 + [False] * 2
    assert extended["block"].unit == "block" and extended["block"].hits == [True, True, False, False]
    edited = history.predicted_reuse(cached[:9] + [60, 61, 62], 4)
    assert {p: (r.reused_tokens, r.computed_tokens) for p, r in edited.items()} == {
        "whole": (0, 12),
        "block": (8, 4),
        "radix": (9, 3),
    }
    assert edited["whole"].hits == [False] * 12 and edited["radix"].hits == [True] * 9 + [False] * 3


def test_prompt_history_aligns_with_the_prompt_sharing_the_longest_prefix():
    history = PromptHistory(limit=3)
    assert history.closest([1, 2, 3]) is None  # nothing published: nothing to compare with
    for prompt in ([1, 2, 9], [1, 2, 3, 4], [1, 7], [1, 2, 3, 5]):
        history.add(prompt)
    assert history.prompts == [[1, 2, 3, 4], [1, 7], [1, 2, 3, 5]]  # the oldest of four is dropped
    assert history.closest([1, 2, 3, 6]) == ([1, 2, 3, 5], 3)  # a tie goes to the newest; differs at 3
    assert history.closest([8]) == ([1, 2, 3, 5], 0)

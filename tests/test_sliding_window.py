"""Past a sliding window, every step can still be seen: a step whose local layers' K/V were handed back to the pool
is rebuilt (its passes replayed, engine/replay.py), and the rebuilt step equals the one the run computed, tensor
for tensor; on Gemma 3 270M a run past 512 positions shows a local layer's cache stop at its window and hand its
oldest blocks back while a global layer keeps every position."""

import numpy as np
import pytest
import torch

import engine
from engine.prefix_cache import PrefixCache
from tests.app_helpers import assert_clean, start
from tests.conftest import GEMMA_WINDOW
from tests.runs import decode
from tests.test_gemma_views import charts, matrix
from ui.host.limits import load_limits
from ui.lesson.chapters import CHAPTERS, WINDOW_PROMPTS, number_of

W = GEMMA_WINDOW


def same_step(rebuilt: engine.StepTrace, original: engine.StepTrace) -> None:
    """Every tensor of the rebuilt step equals the run's own, exactly; and the same token and candidates."""
    assert rebuilt.token_id == original.token_id and rebuilt.positions == original.positions
    for name in engine.StepTrace.HEAVY:
        ours, theirs = getattr(rebuilt, name), getattr(original, name)
        if name == "split":
            if theirs is None:
                assert ours is None
                continue
            ours, theirs = ours.merged, theirs.merged
        assert ours is not None and torch.equal(ours, theirs), (original.step, name)
    assert [c.token_id for c in rebuilt.candidates] == [c.token_id for c in original.candidates]


@pytest.mark.parametrize("kv_splits", [1, 3])
def test_a_step_past_the_window_is_rebuilt_equal_to_the_run(tiny_model, kv_splits):
    """Steps whose window the run has handed back, oldest and newest, in any order: each equals the run's own."""
    model = tiny_model("gemma3")
    generation, traces = decode(
        model,
        list(range(1000, 1006)),
        4 * W,
        block_size=4,
        kv_splits=kv_splits,
        max_new_tokens=4 * W + 1,
        keep_full_traces=10**6,
    )
    window = generation.table.window
    gone = [t for t in traces if t.positions[0] - W + 1 < window.first_position]
    assert len(gone) > W, "the window has handed back what most steps read"
    for index in (gone[-1].step, 0, 1, gone[len(gone) // 2].step, len(traces) - 1):  # a newer one, then older
        same_step(generation.rebuild(index), traces[index])
    assert generation.table.window.first_position == window.first_position, "rebuilding changed nothing of the run"
    assert generation.replay_nbytes > 0
    generation.close()
    pool = generation.pool
    assert generation.replay_nbytes == 0 and pool.block_manager.used == 0 and pool.window.block_manager.used == 0


def test_a_reused_prefix_past_the_window_is_rebuilt_from_what_was_reused(tiny_model):
    """A prefill after a prefix-cache hit computed only the new positions: a replay starts from the reused K/V as
    they were taken, so the prefill and the steps after it rebuild exactly even once the window handed them back."""
    model = tiny_model("gemma3")
    cache = PrefixCache(model, policy="radix", block_size=4, capacity_blocks=64)
    first = engine.Generation(model, list(range(2000, 2007)), prefix_cache=cache, max_new_tokens=2)
    first.prefill()
    first.close()
    generation = engine.Generation(
        model, list(range(2000, 2007)) + [5, 6, 7], prefix_cache=cache, max_new_tokens=3 * W, keep_full_traces=10**6
    )
    traces = [generation.prefill()]
    assert traces[0].prefix.reused_tokens > 0
    while not generation.finished:
        traces.append(generation.step())
    assert generation.table.window.first_position > 0
    for index in (0, 1, len(traces) // 2):
        same_step(generation.rebuild(index), traces[index])
    generation.close()


@pytest.fixture(scope="module")
def long_run(embedded_zh_model):
    """Gemma 3 270M (as the app holds it) on 500 positions of prompt, then decoding past its window of 512; after
    each step, the blocks its window pool has in use (what the pool says, not the generation)."""
    prompt = [embedded_zh_model.tokenizer.bos_token_id] + list(range(1000, 1499))
    generation = engine.Generation(embedded_zh_model, prompt, block_size=16, max_new_tokens=57, keep_full_traces=10**6)
    traces, in_use = [generation.prefill()], []
    in_use.append(generation.pool.window.block_manager.used)
    while not generation.finished:
        traces.append(generation.step())
        in_use.append(generation.pool.window.block_manager.used)
    return generation, traces, in_use


def test_gemma_local_layers_stop_at_the_window_and_hand_blocks_back_while_global_ones_grow(long_run, embedded_zh_model):
    generation, traces, in_use = long_run
    info = embedded_zh_model.info
    window, size = info.sliding_window, 16
    assert window == 512
    for trace, used in zip(traces, in_use):
        length = trace.context_length
        held = length - trace.window_start  # positions the local layers' table holds after this step
        assert len(trace.block_table) == -(-length // size), "a global layer keeps a block for every position"
        assert trace.window_start == max(0, (length - window + 1) // size * size)
        assert min(length, window - 1) <= held <= window - 1 + size - 1
        assert len(trace.window_block_table) == -(-length // size) - trace.window_start // size == used, (
            "every block the local layers' table no longer holds is back in the window pool"
        )
    crossed = [t for t in traces if t.window_start > 0]
    assert crossed and crossed[0].context_length > window, "blocks go back only once the run passed its window"
    assert traces[-1].window_start >= 2 * size and len(traces[-1].block_table) > len(traces[0].block_table)
    assert max(in_use) < len(traces[-1].block_table), "the local layers hold fewer blocks than a global one"
    # What a view reads now: a local layer's last positions only, a global layer's every one.
    for layer, kind in enumerate(info.layer_kinds):
        k, _, start = generation.table.read(layer)
        assert start == (traces[-1].window_start if kind == "local" else 0)
        assert start + k.shape[0] == generation.table.length


def test_gemma_steps_before_the_window_are_rebuilt_equal_to_the_run(long_run):
    """← from past the window to before it: every step rebuilds to the trace the run computed."""
    generation, traces, _ = long_run
    for trace in reversed(traces[-12:]):
        same_step(generation.rebuild(trace.step), trace)
    same_step(generation.rebuild(0), traces[0])


# -- the lesson's chapter on it, on the page -----------------------------------------------------------------------


def reach_rows(at) -> np.ndarray:
    """The chapter's figure as drawn: (layers, positions) of the newest query's attention, NaN where not read."""
    heatmaps = [c for c in charts(at) if c["data"][0]["type"] == "heatmap"]
    assert len(heatmaps) == 1, len(heatmaps)
    return matrix(heatmaps[0]["data"][0]["z"]), heatmaps[0]


def expected_rows(trace: engine.StepTrace, head: int) -> np.ndarray:
    """The engine's own newest row in every layer for Q head `head`, blank where its score is −inf (not read)."""
    rows = trace.attention[:, head, -1].float().numpy().astype(float)
    rows[~np.isfinite(trace.scores[:, head, -1].float().numpy())] = np.nan
    return rows


def test_the_window_chapter_on_gemma_shows_local_rows_lose_their_oldest_columns_and_rebuilds_back_past_it(
    embedded_zh_model,
):
    """Chapter 15 on Gemma 3 (zh): its run passes the window; the figure's local rows are blank exactly before the
    newest query's window and its global rows reach position 0, equal to an engine run of our own; stepping on, the
    blank part grows and the local layers' oldest blocks go back to the page's pool while the global table grows;
    then ← all the way back to the prefill (before any block went back) draws every step as the run first drew it."""
    chapter = next(c for c in CHAPTERS if c.key == "sliding_window")
    info, size = embedded_zh_model.info, chapter.settings["block_size"]
    window = info.sliding_window
    local = [i for i, kind in enumerate(info.layer_kinds) if kind == "local"]
    glob = [i for i, kind in enumerate(info.layer_kinds) if kind == "global"]
    further = 2 * size  # steps past the chapter's own: two more blocks leave the window
    torch.set_num_threads(load_limits().threads)  # as the page computes (a bfloat16 sum may round otherwise)
    _, traces = decode(
        embedded_zh_model, WINDOW_PROMPTS["zh"], chapter.step + further - 1, block_size=size, keep_full_traces=10**6
    )
    at = start(chapter=chapter.number, lang="zh")
    assert_clean(at)
    head = int(at.session_state["w_head"]) if "w_head" in at.session_state else 0
    generation = at.session_state["page"].runner.generation
    assert generation.prompt_ids == traces[0].input_ids and generation.traces[0].context_length > window - size
    seen = {}
    for step in range(chapter.step, chapter.step + further + 1):
        if step > chapter.step:
            at.button(key="b_next").click().run()
            assert_clean(at)
        assert int(at.query_params["step"]) == step
        trace = traces[step - 1]
        rows, fig = reach_rows(at)
        assert rows.shape == (info.layers, trace.context_length)
        first_read = trace.positions[-1] - window + 1
        assert first_read > 0, "the chapter's run is past the window"
        assert np.isnan(rows[local, :first_read]).all() and not np.isnan(rows[local, first_read:]).any()
        assert not np.isnan(rows[glob]).any(), "a global layer reads back to position 0"
        assert np.array_equal(rows, expected_rows(trace, head), equal_nan=True)
        lines = [s for s in fig["layout"].get("shapes", []) if s.get("type") == "line"]
        held_from = (trace.context_length - window + 1) // size * size  # blocks wholly before it went back
        assert [line["x0"] for line in lines] == ([held_from - 0.5] if held_from else [])
        # the page's run: its local layers' table starts there, its window pool holds only that table's blocks
        table, pool = generation.table, generation.pool.window
        assert table.window.first_position == held_from and len(table.blocks) == -(-table.length // size)
        assert pool.block_manager.used == len(table.window.blocks), "a chapter's run starts on an empty prefix cache"
        seen[step] = rows
    assert seen[chapter.step + further].shape[1] - np.isnan(seen[chapter.step + further][local[0]]).sum() == window
    returned_then = traces[chapter.step - 1].window_start // size
    assert generation.table.window.first_position // size == returned_then + 2, "two more blocks went back"
    for step in range(chapter.step + further - 1, 0, -1):  # ← past the kept traces, back to before any went back
        at.button(key="b_back").click().run()
        assert_clean(at)
        assert not at.error and int(at.query_params["step"]) == step
        assert not at.button(key="b_back").disabled or step == 0
        rows, _ = reach_rows(at)
        assert np.array_equal(rows, expected_rows(traces[step - 1], head), equal_nan=True), step
    assert traces[0].window_start == 0  # the prefill: no block had gone back yet


def test_each_models_limits_let_gemma_pass_its_window_in_the_bytes_smollm2_had(embedded_model, embedded_zh_model):
    """The host's token limits are SmolLM2's (float32): its own stay as set; Gemma 3 270M, whose K/V take fewer bytes a
    token, gets a prompt long enough for the window chapter's run to pass 512 positions, its pool no more K/V bytes
    than SmolLM2's, its longest prefill's attention within the step memory; a limit the host raised is never lowered."""
    from ui.host.limits import Limits, model_limits, step_limits

    host = load_limits({})
    smol, gemma = model_limits(host, embedded_model.info), model_limits(host, embedded_zh_model.info)
    assert (smol.max_prompt_tokens, smol.cache_tokens) == (host.max_prompt_tokens, host.cache_tokens)
    chapter = next(c for c in CHAPTERS if c.key == "sliding_window")
    longest = max(len(embedded_zh_model.tokenizer(WINDOW_PROMPTS[lang])["input_ids"]) for lang in WINDOW_PROMPTS)
    assert longest + chapter.step - 1 > embedded_zh_model.info.sliding_window
    assert gemma.max_prompt_tokens >= longest
    budget = host.step_memory_mb * 10**6
    assert 2 * embedded_zh_model.info.attention_bytes(gemma.max_prompt_tokens, gemma.max_prompt_tokens) <= budget
    per_page = {
        m.info.name: limits.cache_tokens * m.info.kv_bytes_per_token
        for m, limits in ((embedded_model, smol), (embedded_zh_model, gemma))
    }
    assert per_page[embedded_zh_model.info.name] <= per_page[embedded_model.info.name]
    raised = Limits(max_prompt_tokens=2000, cache_tokens=4096)
    assert model_limits(raised, embedded_model.info).max_prompt_tokens == 2000
    assert model_limits(raised, embedded_zh_model.info).max_prompt_tokens == 2000
    # the full heatmap of the run's last step (the longest prompt and every new token) fits too, not the prompt's only
    assert (
        step_limits(gemma, embedded_zh_model.info).max_attention_tokens >= gemma.max_prompt_tokens + host.max_new_tokens
    )


def test_the_window_chapter_keeps_its_own_prompt_in_the_pages_language_and_model(embedded_model, embedded_zh_model):
    """The window chapter runs its own prompt only on a model with a window, in the page's language; leaving it for
    another chapter, or a language (and so a model) without a window, puts the class's prompt back."""
    from ui.state.link import default_prompt

    window = number_of("sliding_window")
    at = start(chapter=window, lang="en")  # SmolLM2: no window, the class's prompt
    assert at.session_state["w_prompt"] == default_prompt("en")
    at.selectbox(key="w_lang").set_value("zh").run()  # the Chinese page's model, Gemma 3: the chapter's own prompt
    assert_clean(at)
    assert at.session_state["w_model"] == "embedded-zh" and at.session_state["w_prompt"] == WINDOW_PROMPTS["zh"]
    assert not at.error and not at.warning
    at.selectbox(key="w_lang").set_value("en").run()
    assert_clean(at)
    assert at.session_state["w_model"] == "embedded" and at.session_state["w_prompt"] == default_prompt("en")
    at = start(chapter=window, lang="en", model="embedded-zh")
    assert at.session_state["w_prompt"] == WINDOW_PROMPTS["en"]
    at.button(key="b_chapter_back").click().run()
    assert_clean(at)
    assert at.session_state["w_prompt"] == default_prompt("en") and at.query_params["chapter"] == str(window - 1)

"""The eviction view and its chapter ("What the cache forgets"): the view draws, for each policy and on SmolLM2 and a
tiny Gemma-shaped model, the positions the engine's own run kept (and what each policy's definition keeps); the
chapter's numbers are its figures' data on both embedded models; bad link values and settings get a message in
the page's language; the host's step memory caps or refuses the pair; in a browser the view's controls reach the
link, and the chapter's figure is whole on a projector's first screen."""

import re
import threading
from dataclasses import replace
from functools import cache
from unittest.mock import patch
from urllib.parse import urlencode

import numpy as np
import pytest
import torch
from playwright.sync_api import expect

import engine
from engine.eviction import (
    EVICTION_POLICIES,
    DecodeBudget,
    EvictionRun,
    Policy,
    StreamingWindow,
    n_kept_for_ratio,
    stream_nll,
)
from engine.eviction.batch import EvictionBatch
from tests.app_helpers import assert_clean, open_whole_view, start
from tests.conftest import GEMMA_WINDOW
from tests.helpers import choose, idle, widget
from tests.server import browser_page, settled_text
from tests.test_gemma_views import charts, matrix
from ui.host.limits import load_limits
from ui.lesson.chapters import number_of
from ui.runs import sink_experiment
from ui.runs.eviction import EvictionLab, EvictionLabFull, pair_for
from ui.runs.eviction_settings import EvictionSettings, lab_bytes
from ui.runs.store import RunStore
from ui.text import strings

PROMPT = (
    "Serving systems keep a cache of keys and values; when it no longer fits, they evict some positions and "
    "keep the ones a score ranks highest, then decode"
)
STEP = 3
KEPT, EVICTED, OUTSIDE = 1, 0, 2
SETTINGS = [dict(evict=name, evict_at="prefill", ratio=0.5) for name in EVICTION_POLICIES] + [
    dict(evict="tova", evict_at="decode", budget=12, interval=2),
    dict(evict="snapkv", evict_at="decode", budget=12, interval=2),
    dict(evict="knorm", evict_at="stream", stream_window=6),
]
IDS = [f"{s['evict']}-{s['evict_at']}" for s in SETTINGS]


def engine_run(
    model: engine.Model, ids: list[int], s: dict, steps: int, max_new_tokens: int | None = None
) -> EvictionRun:
    """The engine's run for settings `s` as the view describes them: SnapKV's window (PyramidKV's and AdaKV's) is
    kvpress's 64 where more queries ran, else a quarter of the context (after the prefill) or the interval less one
    (during decode); LagKV's lag is kvpress's 128, or a quarter of the context after its 4 sinks where shorter."""
    if s["evict_at"] == "stream":
        policy, budget, ratio = None, StreamingWindow(4, s["stream_window"]), 0.0
    else:
        queries = (len(ids) - 1) // 4 if s["evict_at"] == "prefill" else s["interval"] - 1
        policy = (
            Policy(s["evict"], window_size=max(1, min(64, queries)))
            if s["evict"] in ("snapkv", "pyramidkv", "adakv")
            else Policy("lagkv", lag_size=max(1, min(128, (len(ids) - 1 - 4) // 4)))
            if s["evict"] == "lagkv"
            else Policy(s["evict"])
        )
        budget = DecodeBudget(s["budget"], s["interval"]) if s["evict_at"] == "decode" else None
        ratio = s.get("ratio", 0.0) if s["evict_at"] == "prefill" else 0.0
    run = EvictionRun(
        model, ids, policy, compression_ratio=ratio, budget=budget, max_new_tokens=max_new_tokens or steps
    )
    run.prefill()
    while len(run.steps) < steps:
        run.step()
    return run


def kept_map(at) -> np.ndarray:
    """The view's main figure: its heatmap's states, one row per (layer, KV head)."""
    heatmap = next(c for c in charts(at) if c["data"][0]["type"] == "heatmap")
    return matrix(heatmap["data"][0]["z"])


def definition_holds(states: np.ndarray, model: engine.Model, s: dict, context: int) -> None:
    """What each policy's definition says a row read at pass STEP, whatever its scores: a ratio keeps
    int(context × (1 − ratio)) of the context, then every new position; a decode budget, `budget` after each eviction
    (every `interval` passes) and one more a pass since; the streaming window keeps 4 sinks and the
    latest `stream_window` (+ the position the pass added); a sliding-window layer keeps its window, no sinks."""
    info = model.info
    length = states.shape[-1]
    for layer in range(info.layers):
        if s["evict"] == "adakv" and info.window(layer) is None:  # the layer's count, shared unevenly by its heads
            read = (states[layer * info.kv_heads : (layer + 1) * info.kv_heads] == KEPT).sum()
            assert read == info.kv_heads * (n_kept_for_ratio(context, s["ratio"]) + STEP), (layer, read)
            continue
        for kv in range(info.kv_heads):
            row = states[layer * info.kv_heads + kv]
            read = set(np.flatnonzero(row == KEPT).tolist())
            if info.window(layer) is not None:
                assert read == set(range(max(0, length - info.window(layer)), length)), (layer, kv)
                assert not (row == EVICTED).any() and (row[: length - info.window(layer)] == OUTSIDE).all()
            elif s["evict_at"] == "prefill":
                count = Policy(s["evict"], window_size=context // 4).layer_budget(
                    context, s["ratio"], layer, info.layers
                )
                assert len(read) == count + STEP, (layer, kv, len(read))
            elif s["evict_at"] == "stream":
                assert read == set(range(4)) | set(range(length - s["stream_window"] - 1, length)), (layer, kv)
            else:  # the last eviction was after pass `last` (the budget then), each pass since added one
                last = (STEP - 1) // s["interval"] * s["interval"]
                assert len(read) == (s["budget"] + STEP - last if last else length), (layer, kv, len(read))


def check_view(at, model: engine.Model, s: dict) -> None:
    assert_clean(at)
    assert strings.t("evict_title") in [h.value for h in at.subheader]
    ids = engine.Generation(model, PROMPT, chat=False).prompt_ids
    states = kept_map(at)
    run = engine_run(model, ids, s, STEP)
    step = run.steps[STEP - 1]
    info = model.info
    expected = np.full((info.layers, info.kv_heads, step.position + 1), KEPT, dtype=float)
    for layer, mask in enumerate(step.kept):
        if mask is not None:
            expected[layer] = mask.numpy()
        else:
            expected[layer, :, : step.position + 1 - info.cached_positions(layer, step.position + 1)] = OUTSIDE
    assert np.array_equal(states, expected.reshape(-1, step.position + 1)), "the map is not what the engine kept"
    definition_holds(states, model, s, len(ids) - 1)
    assert (states == EVICTED).any(), "nothing was evicted: the settings test nothing"
    run.close()


@pytest.mark.parametrize("s", SETTINGS, ids=IDS)
def test_the_view_draws_what_each_policy_kept_on_smollm2(s, embedded_model):
    at = start(view="eviction", prompt=PROMPT, chat=0, step=STEP, **s)
    check_view(at, embedded_model, s)


@pytest.mark.parametrize("s", SETTINGS, ids=IDS)
def test_the_view_draws_what_each_policy_kept_on_a_tiny_gemma(s, tiny_model, tiny_model_dir, monkeypatch):
    """Gemma's local layers keep their window (no sinks: grey before it); only its global layer evicts."""
    folder = tiny_model_dir("gemma3")
    monkeypatch.setenv("KVSCOPE_MODELS", folder)
    at = start(view="eviction", model=folder, prompt=PROMPT, chat=0, step=STEP, **s)
    model = tiny_model("gemma3")
    check_view(at, model, s)
    states = kept_map(at)
    assert (states == OUTSIDE).any() and GEMMA_WINDOW < states.shape[-1]
    text = "\n".join(c.value for c in at.caption).replace("\\", "")
    assert "no sinks" in text and "re-numbers positions" in text and "masked, not freed" in text


def test_a_pass_record_owns_its_arrays(embedded_model):
    """Each recorded pass holds arrays of its own, not views into the pass's tensors: a view of one position's
    attention kept every position's alive (a lab at step 64 on a 382-token prompt held about 300 MB more)."""
    ids = engine.Generation(embedded_model, PROMPT, chat=False).prompt_ids
    pair = pair_for(
        RunStore(10**9), embedded_model, ids, EvictionSettings("tova", "prefill", 0.5, 32, 8, 28), STEP, 2000
    )
    pair.advance_to(STEP)
    for run in pair.lab.runs.values():
        for record in run.passes:
            for array in (record.kept, record.evicted_share, record.sink_share):
                assert array.flags.owndata, "a record's array is a view of a larger tensor"


def test_a_change_of_policy_reads_runs_the_lab_has_computed(embedded_model):
    """Every policy at one timing is a run of one lab, computed once some page asks for it: the first page's policy
    from the prefill, each later one joining at the lab's step; a page switching to a policy the lab has reads passes
    already computed (none is computed again), the full cache's run is shared, and the runs equal each run made
    alone."""
    ids = engine.Generation(embedded_model, PROMPT, chat=False).prompt_ids
    store = RunStore(10**9)
    snapkv = EvictionSettings("snapkv", "prefill", 0.5, 32, 8, 28)
    pair = pair_for(store, embedded_model, ids, snapkv, STEP, 2000)
    assert pair.advance_to(STEP) == STEP
    assert set(pair.lab.runs) == {None, "snapkv"}, "the lab computed a policy nobody asked for"
    full_passes = list(pair.full.passes)
    computed = {}
    for policy in EVICTION_POLICIES:
        again = pair_for(store, embedded_model, ids, EvictionSettings(policy, "prefill", 0.5, 32, 8, 28), STEP, 2000)
        assert again.lab is pair.lab and again.full is pair.full
        assert again.advance_to(STEP) == STEP
        computed[policy] = list(again.evicting.passes)
    assert set(pair.lab.runs) == {None, *EVICTION_POLICIES} and not pair.lab.joining
    assert all(a is b for a, b in zip(pair.full.passes, full_passes, strict=True)), "the full cache computed again"
    for policy in EVICTION_POLICIES:
        again = pair_for(store, embedded_model, ids, EvictionSettings(policy, "prefill", 0.5, 32, 8, 28), STEP, 2000)
        assert again.advance_to(STEP) == STEP
        assert all(a is b for a, b in zip(again.evicting.passes, computed[policy], strict=True)), "computed again"
    assert store.built == 1
    other_timing = pair_for(store, embedded_model, ids, EvictionSettings("knorm", "stream", 0.5, 32, 8, 6), STEP, 2000)
    other_timing.advance_to(STEP)
    assert other_timing.lab is not pair.lab and store.built == 2 and set(other_timing.lab.runs) == {None, "stream"}
    for s in (
        dict(evict="tova", evict_at="prefill", ratio=0.5),
        dict(evict="knorm", evict_at="stream", stream_window=6),
    ):
        alone = engine_run(embedded_model, ids, s, STEP)
        lab_pair = pair if s["evict_at"] == "prefill" else other_timing
        name = "tova" if s["evict_at"] == "prefill" else "stream"
        assert [p.token_id for p in lab_pair.lab.runs[name].passes] == alone.generated
        for record, step in zip(lab_pair.lab.runs[name].passes, alone.steps):
            for layer, mask in enumerate(step.kept):
                if mask is not None:
                    assert np.array_equal(record.kept[layer], mask.numpy().astype(np.int8))
        alone.close()


def test_a_pair_catching_up_tells_its_passes_as_they_come(embedded_model):
    """A page's pair says how far the lab got (the page shows it while it waits): the first pair each pass from the
    prefill on, a policy joining later each pass it catches up, once each."""
    ids = engine.Generation(embedded_model, PROMPT, chat=False).prompt_ids
    store, told = RunStore(10**9), []
    for policy in ("snapkv", "tova", "snapkv"):
        pair = pair_for(store, embedded_model, ids, EvictionSettings(policy, "prefill", 0.5, 32, 8, 28), STEP, 2000)
        told.append([])
        assert pair.advance_to(STEP, told[-1].append) == STEP
    passes = list(range(1, STEP + 1))
    assert told == [passes, passes, []]  # the prefill on; TOVA's catch-up; a policy the lab has: nothing to wait for


def test_a_policy_joins_the_lab_only_while_the_step_memory_holds_it(embedded_model):
    """A lab is planned for its pair: on a host whose step memory holds just that, the first page's policy runs and
    another is refused with the policies the lab compares, which still run."""
    ids = engine.Generation(embedded_model, PROMPT, chat=False).prompt_ids
    knorm = EvictionSettings("knorm", "prefill", 0.5, 32, 8, 28)
    assert (
        lab_bytes(embedded_model.info, len(ids), STEP, knorm, 3)
        - lab_bytes(embedded_model.info, len(ids), STEP, knorm, 2)
        > 10**6
    )
    budget_mb = -(-lab_bytes(embedded_model.info, len(ids), STEP, knorm) // 10**6)
    store = RunStore(10**9)
    assert pair_for(store, embedded_model, ids, knorm, STEP, budget_mb).advance_to(STEP) == STEP
    with pytest.raises(EvictionLabFull) as refused:
        pair_for(store, embedded_model, ids, replace(knorm, policy="tova"), STEP, budget_mb).advance_to(STEP)
    assert refused.value.names == ["knorm"]
    assert pair_for(store, embedded_model, ids, knorm, STEP, budget_mb).advance_to(STEP) == STEP


def test_a_joining_policy_catches_up_alone_against_the_full_caches_kept_hidden_states(embedded_zh_model):
    """A policy that joins a lab steps one row a pass, its own (no second run of the full cache beside it), and reads
    its KL from the full cache's logits computed again from the final hidden states the lab kept (its few passes at
    once): on Gemma in bfloat16, within a rounding of the full cache's own logits (lm_head over other rows)."""
    model, steps = embedded_zh_model, 4
    ids = engine.Generation(model, "KV 缓存里存的是", chat=False).prompt_ids
    store = RunStore(10**9)
    settings = EvictionSettings("snapkv", "prefill", 0.5, 32, 8, 28)
    pair = pair_for(store, model, ids, settings, steps, 2000)
    assert pair.advance_to(steps) == steps
    lab = pair.lab
    assert [tuple(h.shape) for h in lab.full_hidden] == [(model.info.hidden,)] * steps
    again, own = model.logits(torch.stack(lab.full_hidden))[-1], lab.runs[None].run.steps[-1].logits
    torch.testing.assert_close(again, own, rtol=0, atol=float(own.abs().max()) * 2**-8)
    rows, forward_batch = [], model.forward_batch

    def counted(passes, **options):
        rows.append(len(passes))
        return forward_batch(passes, **options)

    with patch.object(model, "forward_batch", counted):
        joined = pair_for(store, model, ids, replace(settings, policy="tova"), steps, 2000)
        assert joined.advance_to(steps) == steps
    assert rows == [1] * (1 + steps)  # the context again for its prefill's evictions, then its passes alone
    full, tova = lab.runs[None].passes, lab.runs["tova"]
    agreed = all(f.token_id == t.token_id for f, t in zip(full[:-1], tova.passes[:-1]))
    last = kl_from_full(again, tova.run.steps[-1].logits) if agreed else None
    assert tova.passes[-1].kl == (pytest.approx(last, rel=1e-9) if agreed else None)


def test_pages_asking_at_once_build_one_lab(embedded_model):
    """Two pages asking for the same lab at the same moment: one builds it, the other waits and reads it."""
    ids = engine.Generation(embedded_model, PROMPT, chat=False).prompt_ids
    store = RunStore(10**9)
    settings = EvictionSettings("tova", "prefill", 0.5, 32, 8, 28)
    building, go = threading.Event(), threading.Event()
    made = []

    def slow_lab(*args):
        building.set()
        go.wait(60)
        made.append(EvictionLab(*args))
        return made[-1]

    results = []
    with patch("ui.runs.eviction.EvictionLab", side_effect=slow_lab):
        first = threading.Thread(target=lambda: results.append(pair_for(store, embedded_model, ids, settings, 2, 2000)))
        first.start()
        assert building.wait(60)
        second = threading.Thread(
            target=lambda: results.append(pair_for(store, embedded_model, ids, settings, 2, 2000))
        )
        second.start()
        go.set()
        first.join(60)
        second.join(60)
    assert len(made) == 1 and store.built == 1
    assert len(results) == 2 and results[0].lab is results[1].lab is made[0]


def test_labs_are_counted_and_swept_by_the_run_store(embedded_model):
    """A lab's bytes count in the store (it grows as it steps); older labs go when the store is over its bytes, and
    an idle one at the sweep."""
    ids = engine.Generation(embedded_model, PROMPT, chat=False).prompt_ids
    now = [0.0]
    store = RunStore(10**9, idle_seconds=60, clock=lambda: now[0])
    prefill = EvictionSettings("tova", "prefill", 0.5, 32, 8, 28)
    pair = pair_for(store, embedded_model, ids, prefill, STEP, 2000)
    before = pair.lab.nbytes
    pair.advance_to(STEP)
    grown = pair.lab.nbytes
    assert before == 0 < grown  # nothing computed until a page steps it
    pool = pair.lab.batch.pool
    assert grown >= pool.block_manager.used * pool.block_size * embedded_model.info.kv_bytes_per_token
    streaming = EvictionSettings("knorm", "stream", 0.5, 32, 8, 6)
    stream = pair_for(store, embedded_model, ids, streaming, STEP, 2000)
    stream.advance_to(STEP)
    assert len(store.keys) == 2
    store.max_bytes = stream.lab.nbytes  # room for the newest only
    store.trim()
    assert store.keys == [("eviction", id(embedded_model), tuple(ids), STEP, streaming.lab_settings)]
    now[0] = 61.0
    assert store.expire() == 1 and store.keys == []


# -- the chapter's numbers are its figures' data ----------------------------------------------------------------


def kl_from_full(full: torch.Tensor, evicting: torch.Tensor) -> float:
    """KL(full ‖ evicting) of two passes' next-token distributions, in nats, by torch's own kl_div."""
    return torch.nn.functional.kl_div(
        evicting.double().log_softmax(-1), full.double().log_softmax(-1), log_target=True, reduction="sum"
    ).item()


def test_the_lab_records_each_policys_next_token_kl_from_the_full_cache(embedded_model):
    """Each policy's KL(full cache ‖ policy) per answer token is the KL of the two runs made alone, while their texts
    agree; from the token after they part, none (the two predict after different texts)."""
    steps = 6
    ids = engine.Generation(embedded_model, PROMPT, chat=False).prompt_ids
    store = RunStore(10**9)
    pair = pair_for(store, embedded_model, ids, EvictionSettings("snapkv", "prefill", 0.5, 32, 8, 28), steps, 2000)
    assert pair.advance_to(steps) == steps
    for policy in EVICTION_POLICIES:  # each joins the lab at its last step: its KL from the full cache's logits again
        pair_for(
            store, embedded_model, ids, EvictionSettings(policy, "prefill", 0.5, 32, 8, 28), steps, 2000
        ).advance_to(steps - 2)
    assert pair.advance_to(steps) == steps
    assert all(p.kl is None for p in pair.full.passes)
    full = EvictionRun(embedded_model, ids, None, max_new_tokens=steps)
    full.prefill()
    while len(full.steps) < steps:
        full.step()
    parted = []
    for policy in EVICTION_POLICIES:
        alone = engine_run(embedded_model, ids, dict(evict=policy, evict_at="prefill", ratio=0.5), steps)
        expected, agree = [], True
        for f, a in zip(full.steps, alone.steps, strict=True):
            expected.append(kl_from_full(f.logits, a.logits) if agree else None)
            agree = agree and f.token_id == a.token_id
        parted.append(not agree)
        got = [p.kl for p in pair.lab.runs[policy].passes]
        assert [g is None for g in got] == [e is None for e in expected], policy
        assert [g for g in got if g is not None] == pytest.approx(
            [e for e in expected if e is not None], rel=1e-3, abs=1e-6
        ), policy
        alone.close()
    full.close()
    assert any(parted), "no policy parted: the rule after parting is not tested"


@pytest.mark.parametrize(("model_name", "lang"), [("embedded", "en"), ("embedded-zh", "zh")])
def test_the_cost_sentence_quotes_the_cost_figure(model_name, lang, request):
    """The view's cost part: one line per policy the lab has computed at the link's timing (here a classmate's
    knorm, then the page's TOVA), the page's drawn thickest, and the sentence under it quotes that line at the page's
    token (or where its text parted)."""
    request.getfixturevalue({"embedded": "embedded_model", "embedded-zh": "embedded_zh_model"}[model_name])
    step = 5
    # a prompt of this test's own: a lab another test of this process ran on the default prompt holds other policies
    prompt = {"en": "What does a KV cache hold, and why?", "zh": "KV 缓存里存的是什么？它存的是"}[lang]
    link = dict(view="eviction", step=step, lang=lang, model=model_name, evict_at="prefill", ratio=0.5, prompt=prompt)
    assert_clean(start(evict="knorm", **link))
    at = start(evict="tova", **link)
    assert_clean(at)
    lines = [chart["data"] for chart in charts(at) if chart["data"][0].get("mode") == "lines+markers"]
    assert len(lines) == 1 and {trace["name"] for trace in lines[0]} == {
        strings.t("evict_short_knorm", lang),
        strings.t("evict_short_tova", lang),
    }
    text = "\n".join(c.value for c in at.caption).replace("\\", "")
    assert str(strings.t("evict_cost_lab", lang, count=2, total=len(EVICTION_POLICIES))).replace("\\", "") in text
    chosen = max(lines[0], key=lambda trace: trace["line"]["width"])
    assert chosen["name"] == strings.t("evict_short_tova", lang)
    values = [None if v is None else float(v) for v in chosen["y"]]
    assert len(values) == step
    text = "\n".join(c.value for c in at.caption).replace("\\", "")
    if values[-1] is not None:
        assert f"{values[-1]:.3g}" in text and (f"answer token {step}," in text or f"第 {step} 个" in text)
    else:
        last = max(i for i, v in enumerate(values) if v is not None)
        assert f"{values[last]:.3g}" in text and (f"answer token {last + 1} " in text or f"第 {last + 1} 个" in text)


def figures(at) -> dict:
    """The view's figures by their shape: the kept map, the hidden share (heatmap over Q heads), the sink (two bar
    series), the bytes (one horizontal bar series)."""
    out = {}
    for chart in charts(at):
        data = chart["data"]
        if data[0]["type"] == "heatmap" and "kept" not in out:
            out["kept"] = matrix(data[0]["z"])
        elif data[0]["type"] == "heatmap" and isinstance(data[0]["x"], list) and str(data[0]["x"][0]).startswith("q"):
            out["share"] = matrix(data[0]["z"])
        elif data[0]["type"] == "bar" and len(data) == 2:
            out["sink"] = matrix(data[0]["y"]), matrix(data[1]["y"])
        elif data[0]["type"] == "bar" and data[0].get("orientation") == "h":
            out["bytes"] = matrix(data[0]["x"])
    return out


def panel_text(at) -> str:
    panel = at.container("chapter")
    return "\n".join(m.value for m in panel.markdown).replace("\\", "")


def layer_words(layer: int, lang: str) -> str:
    return f"layer {layer}" if lang == "en" else f"第 {layer} 层"


@pytest.mark.parametrize(("model_name", "lang"), [("embedded", "en"), ("embedded-zh", "zh")])
def test_the_chapters_numbers_are_its_figures_data(model_name, lang, request):
    request.getfixturevalue({"embedded": "embedded_model", "embedded-zh": "embedded_zh_model"}[model_name])
    at = start(chapter=number_of("evicting"), lang=lang)
    assert_clean(at)
    at = open_whole_view(at)
    assert_clean(at)
    found, text = figures(at), panel_text(at)
    assert set(found) == {"kept", "share", "sink", "bytes"}, set(found)
    full, _ = found["sink"]
    sink_layer = int(np.argmax(full))
    assert f"{100 * full[sink_layer]:.1f}%" in text and layer_words(sink_layer, lang) in text
    by_layer = found["share"].mean(axis=1)
    share_layer = int(np.argmax(by_layer))
    assert f"{100 * by_layer[share_layer]:.1f}%" in text and layer_words(share_layer, lang) in text
    for value in found["bytes"]:
        assert f"{value / 1024:,.1f} KiB" in text, value
    kept = found["kept"]
    counts = [(row == KEPT).sum() for row in kept if not (row == OUTSIDE).any() and (row == EVICTED).any()]
    assert counts, "no row evicted anything"
    low, high = min(counts), max(counts)
    assert (f"**{low:,}**" if low == high else f"**{low:,}–{high:,}**") in text
    assert f"{kept.shape[1]:,}" in text  # the positions at this step
    if model_name == "embedded-zh":  # past Gemma 3's window: the local layers keep no sinks
        assert (kept == OUTSIDE).any() and "没有 sink" in text


@cache
def chapter_runs(model: engine.Model, prompt_ids: tuple[int, ...], step: int) -> tuple[list[str], float]:
    """The eviction chapter's numbers computed here from the engine, for tests/test_lesson.py, and the strongest
    sink: the default settings (SnapKV, half the context evicted after the prefill) at `step`: the positions each
    evicting (layer, KV head) read, the bytes three ways, the full cache's largest share on position 0 (a layer's,
    averaged over its Q heads), and what SnapKV cost the next token (`chapter_kl`)."""
    ids = list(prompt_ids)
    threads = torch.get_num_threads()
    torch.set_num_threads(load_limits().threads)  # as the page computes: in bfloat16 the sums' order shows
    try:
        run = engine_run(model, ids, dict(evict="snapkv", evict_at="prefill", ratio=0.5), step)
        full = EvictionRun(model, ids, None, max_new_tokens=step)
        full.prefill()
        while len(full.steps) < step:
            full.step()
        kl = chapter_kl(model, ids, step)
    finally:
        torch.set_num_threads(threads)
    kept = n_kept_for_ratio(len(ids) - 1, 0.5) + step
    sink = full.steps[-1].attention[:, :, 0].float().mean(dim=1).max().item()
    numbers = [
        f"{kept:,}",
        f"{run.kept_bytes() / 1024:,.1f}",
        f"{run.allocated_bytes() / 1024:,.1f}",
        f"{run.full_bytes() / 1024:,.1f}",
        f"{100 * sink:.1f}%",
        kl,
    ]
    run.close(), full.close()
    return numbers, sink


def chapter_kl(model: engine.Model, ids: list[int], step: int) -> str:
    """What the chapter says SnapKV cost: the next-token KL(full cache ‖ SnapKV) at its token while both answers
    agree, else at the token where they part; from the runs as the page's lab batches them (the same products)."""
    variants = EvictionSettings("snapkv", "prefill", 0.5, 32, 8, 28).variants(len(ids) - 1)
    batch = EvictionBatch(model, ids, list(variants.values()), max_new_tokens=step, keep_full_steps=step)
    batch.prefill()
    while len(batch.runs[0].steps) < step:
        batch.step()
    full, snapkv = batch.runs[0], batch.runs[list(variants).index("snapkv")]
    for a, b in zip(full.steps, snapkv.steps):
        kl = kl_from_full(a.logits, b.logits)
        if a.token_id != b.token_id:
            break
    batch.close()
    return f"{kl:.3g}"


def eviction_numbers(model: engine.Model, prompt_ids: list[int], step: int) -> list[str]:
    return chapter_runs(model, tuple(prompt_ids), step)[0]


def strong_sink(model: engine.Model, prompt_ids: list[int], step: int) -> bool:
    """Whether a layer of the full cache's run puts at least a fifth of its attention on position 0: the premise of
    the chapter's question about the sink."""
    return chapter_runs(model, tuple(prompt_ids), step)[1] >= 0.2


# -- bad values ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize(
    ("param", "value", "reason"),
    [
        ("ratio", "half", "bad_number"),
        ("ratio", "1", "out_of_range"),
        ("evict", "h2o", "unknown_choice"),
        ("budget", "0", "out_of_range"),
        ("evict_at", "sometimes", "unknown_choice"),
    ],
)
def test_a_bad_link_value_is_named_in_the_pages_language(param, value, reason, lang, embedded_model):
    at = start(view="eviction", step=2, lang=lang, model="embedded", **{param: value})
    assert_clean(at)
    warnings = [w.value.replace("\\", "") for w in at.warning]  # Markdown's escapes undone
    reason_text = strings.t("reason_" + reason, lang)
    assert any(f"{param}={value}" in w and reason_text in w for w in warnings), warnings
    assert kept_map(at).size  # the view still draws, at the fallback


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_settings_that_cannot_run_say_why_in_the_pages_language(lang, embedded_model):
    at = start(view="eviction", step=2, lang=lang, model="embedded", evict="snapkv", evict_at="decode", interval=1)
    assert_clean(at)
    assert strings.t("evict_snapkv_interval", lang) in [w.value for w in at.warning]
    for prompt, key in (("Hi there, you", "evict_too_few_for_sinks"), ("Hi", "evict_short_prompt")):
        ids = engine.Generation(embedded_model, prompt, chat=False).prompt_ids
        at = start(view="eviction", step=1, lang=lang, model="embedded", prompt=prompt, chat=0, evict="streaming_llm")
        assert_clean(at)
        n = len(ids) - 1 if key == "evict_too_few_for_sinks" else len(ids)
        assert strings.t(key, lang, n=n) in [w.value for w in at.warning], (n, [w.value for w in at.warning])


def test_the_hosts_step_memory_caps_the_pair_with_a_message(embedded_model, monkeypatch):
    """At KVSCOPE_STEP_MEMORY_MB=16 the pair of SmolLM2 runs (two pools of 46,080 B a position) cannot decode the
    host's 128 tokens: it stops where its estimate fits, says so, and the page past that point says the runs ended."""
    monkeypatch.setenv("KVSCOPE_STEP_MEMORY_MB", "16")
    at = start(view="eviction", prompt=PROMPT, chat=0, step=2, evict="knorm", evict_at="stream", stream_window=6)
    assert_clean(at)
    capped = [i.value for i in at.info if "KVSCOPE_STEP_MEMORY_MB = 16" in i.value]
    assert capped, [i.value for i in at.info]
    steps = int(re.search(r"for (\d+) answer tokens", capped[0]).group(1))
    assert 2 <= steps < 128
    at = start(
        view="eviction", prompt=PROMPT, chat=0, step=steps + 1, evict="knorm", evict_at="stream", stream_window=6
    )
    assert_clean(at)
    assert strings.t("evict_ended", passes=steps, step=steps + 1) in [c.value for c in at.caption]


def test_a_pair_that_cannot_fit_one_step_is_refused_with_a_message(embedded_model, monkeypatch):
    monkeypatch.setenv("KVSCOPE_STEP_MEMORY_MB", "16")
    long_prompt = " ".join(["The cache keeps every position it was given."] * 25)  # 225 tokens: a pair's step > 16 MB
    at = start(view="eviction", prompt=long_prompt, chat=0, step=1)
    assert_clean(at)
    assert any("KVSCOPE_STEP_MEMORY_MB = 16" in w.value and "MB for one step" in w.value for w in at.warning), [
        w.value for w in at.warning
    ]


# -- in a browser ------------------------------------------------------------------------------------------


@pytest.mark.browser
def test_the_views_controls_reach_the_link(server):
    """Each of the view's own controls, clicked, reaches the link and the figure. In English: the widgets are the same
    in Chinese (their labels: tests/test_app.py's check for English left on a Chinese page), and the eviction
    chapter's figure on the first screen, on both models and languages, is the lesson walks' check
    (tests/test_lesson_walk.py)."""
    with browser_page(1280, 720) as page:
        page.goto(f"{server}/?{urlencode(dict(view='eviction', step=2))}")
        settled_text(page)
        idle(page)
        widget(page, "w_evict_at").get_by_text(strings.t("evict_at_decode")).click()
        expect(widget(page, "w_budget")).to_be_visible(timeout=120_000)
        idle(page)
        assert "evict_at=decode" in page.url
        box = widget(page, "w_evict").locator('[role="combobox"]')
        box.click()
        page.locator('[role="option"]', has_text=strings.t("evict_policy_tova")).first.click()
        page.wait_for_url("**evict=tova**", timeout=120_000)
        idle(page)
        field = widget(page, "w_interval").locator("input")
        field.fill("3")
        field.press("Enter")
        page.wait_for_url("**interval=3**", timeout=120_000)
        idle(page)
        widget(page, "evict_own_cache").locator("label").first.click()
        expect(page.locator(".kv-figure-title").first).to_contain_text(
            strings.t("evict_kept_title_own", policy="", token=2, length=0)[:12], timeout=120_000
        )
        widget(page, "w_evict_at").get_by_text(strings.t("evict_at_stream")).click()
        expect(widget(page, "w_stream_window")).to_be_visible(timeout=120_000)
        idle(page)
        assert "evict_at=stream" in page.url


@pytest.mark.browser
def test_keydiff_and_the_streaming_experiment_open_from_the_page(server):
    """Clicked in a browser: KeyDiff chosen in the policy list reaches the link and the map's title; the StreamingLLM
    expander opened computes its experiment (a progress bar meanwhile) and draws both figures and the sentence."""
    with browser_page(1280, 720) as page:
        page.goto(f"{server}/?{urlencode(dict(view='eviction', step=2))}")
        settled_text(page)
        idle(page)
        choose(page, "w_evict", strings.t("evict_policy_keydiff"))
        page.wait_for_url("**evict=keydiff**", timeout=120_000)
        expect(page.locator(".kv-figure-title").first).to_contain_text("KeyDiff", timeout=120_000)
        idle(page)
        widget(page, "x_streaming").locator("summary").first.click()
        part = widget(page, "x_streaming")
        expect(part.locator(".kv-figure-title")).to_have_count(2, timeout=300_000)
        expect(part.locator(".kv-figure-title").nth(1)).to_contain_text(
            str(strings.t("evict_streaming_sinks_title", cache=sink_experiment.CACHE))[:30]
        )
        expect(part).to_contain_text(
            str(
                strings.t("evict_streaming_said", tokens=0, cache=0, full="", alone="", one="", four="", four_inside="")
            )[:9],
            timeout=120_000,
        )
        idle(page)


@pytest.mark.browser
def test_adakv_and_the_forced_reading_open_from_the_page(server):
    """Clicked in a browser: AdaKV chosen in the policy list reaches the link and says how its heads shared the
    count; the teacher-forced expander opened reads the answer through both caches and says so; switched to
    decode, AdaKV is refused in words."""
    with browser_page(1280, 720) as page:
        page.goto(f"{server}/?{urlencode(dict(view='eviction', step=2))}")
        settled_text(page)
        choose(page, "w_evict", strings.t("evict_policy_adakv"))
        page.wait_for_url("**evict=adakv**", timeout=120_000)
        expect(page.get_by_text(str(strings.t("evict_ada_heads", fewest=0, most=0)).split(":")[0])).to_be_visible(
            timeout=120_000
        )
        idle(page)
        widget(page, "x_forced").locator("summary").first.click()
        expect(widget(page, "x_forced")).to_contain_text(
            str(
                strings.t("evict_forced_more", n=2, policy="", evicting=0, full=0, delta=0, ppl_evicting=0, ppl_full=0)
            )[:30],
            timeout=120_000,
        )
        idle(page)
        widget(page, "w_evict_at").get_by_text(strings.t("evict_at_decode")).click()
        expect(page.get_by_text(str(strings.t("evict_prefill_only", policy="AdaKV"))[:20])).to_be_visible(
            timeout=120_000
        )


def test_the_streaming_experiment_reads_the_text_through_each_cache_it_names(tiny_model, monkeypatch):
    """Each configuration is the engine's streamed NLL with its sinks, the rest of the cache's positions as the
    window, and its numbering; the full cache's is the text read in full."""
    monkeypatch.setattr(sink_experiment, "TEXT_TOKENS", 40)
    monkeypatch.setattr(sink_experiment, "CACHE", 12)
    model = tiny_model("llama")
    experiment = sink_experiment.SinkExperiment(model, "en")
    seen = []
    experiment.compute(lambda done, total: seen.append((done, total)))
    assert experiment.done and seen == [(i, len(sink_experiment.CONFIGS) + 1) for i in range(len(seen))]
    ids = experiment.ids
    assert len(ids) == 40
    assert np.array_equal(experiment.full, stream_nll(model, ids).numpy())
    for config in sink_experiment.CONFIGS:
        window = StreamingWindow(config.sinks, 12 - config.sinks)
        assert np.array_equal(experiment.nll[config], stream_nll(model, ids, window, rerotate=config.inside).numpy())
    assert experiment.of(0, inside=True) is experiment.of(0)  # no sinks: nothing to number otherwise


@pytest.mark.parametrize(("model_name", "lang"), [("embedded", "en"), ("embedded-zh", "zh")])
def test_the_streaming_sentence_quotes_its_figure(model_name, lang, request):
    """The streaming part on each embedded model: the bars are the means past the cache, and the sentence's costs
    are those bars less the full cache's line."""
    request.getfixturevalue({"embedded": "embedded_model", "embedded-zh": "embedded_zh_model"}[model_name])
    at = start(view="eviction", step=2, lang=lang, model=model_name)
    at.session_state["x_streaming"] = True
    # The experiment's ten readings of the text: minutes for Gemma's bfloat16 passes on a CPU without native bfloat16
    # (AVX2 only: ~0.3 ms a row per 640 × 2048 product, whatever the batch), within the test's limit (pytest.ini).
    at = at.run(timeout=540)
    assert_clean(at)
    bars = next(
        chart
        for chart in charts(at)
        if chart["data"][0]["type"] == "bar"
        and len(chart["data"]) == 3
        and chart["data"][0]["x"] == [str(n) for n in sink_experiment.SINKS]
    )
    written, inside, line = (matrix(trace["y"]) for trace in bars["data"])
    full = float(line[0])
    text = "\n".join(m.value for m in at.markdown).replace("\\", "")
    for value in (written[0], written[1], written[3], inside[3]):  # the window alone, one sink, four, four inside
        assert f"**{value - full:.2f}**" in text, (value - full, text[-600:])
    assert f"{full:.2f}" in text
    assert written[0] - full > 3 * (written[3] - full) > 0, "four sinks did not bring back most of what the window lost"


@pytest.mark.parametrize(("model_name", "lang"), [("embedded", "en"), ("embedded-zh", "zh")])
@pytest.mark.parametrize(("policy", "ratio"), [("pyramidkv", 0.5), ("pyramidkv", 0.75), ("adakv", 0.5)])
def test_the_budgets_sentence_reads_the_map(model_name, lang, policy, ratio, request):
    """PyramidKV's sentence names the first and last evicting layers' counts (or says the pyramid is flat), AdaKV's
    the fewest and most positions a KV head kept (or that the model has one KV head a layer): as the map shows."""
    model = request.getfixturevalue({"embedded": "embedded_model", "embedded-zh": "embedded_zh_model"}[model_name])
    at = start(view="eviction", step=2, lang=lang, model=model_name, evict=policy, evict_at="prefill", ratio=ratio)
    assert_clean(at)
    info = model.info
    states = kept_map(at).reshape(info.layers, info.kv_heads, -1)
    evicting = [i for i in range(info.layers) if info.window(i) is None]
    read = {(i, h): int((states[i, h] == KEPT).sum()) for i in evicting for h in range(info.kv_heads)}
    text = "\n".join(c.value for c in at.caption).replace("\\", "")
    if policy == "adakv":
        expected = (
            strings.t("evict_ada_one_head", lang, model=info.name)
            if info.kv_heads == 1
            else strings.t("evict_ada_heads", lang, fewest=min(read.values()), most=max(read.values()))
        )
        assert info.kv_heads == 1 or min(read.values()) < max(read.values()), "AdaKV shared nothing unevenly"
    else:
        first, last = read[evicting[0], 0], read[evicting[-1], 0]
        flat = len(set(read.values())) == 1
        expected = (
            strings.t("evict_pyramid_flat", lang, count=first)
            if flat
            else strings.t("evict_pyramid_layers", lang, first=evicting[0], most=first, last=evicting[-1], least=last)
        )
        assert flat == (ratio > 0.5), "at half evicted or less the pyramid holds on these prompts; above, it cannot"
    assert str(expected).replace("\\", "") in text, (expected, text[-500:])


@pytest.mark.parametrize(
    ("model_name", "lang", "s"),
    [
        ("embedded", "en", dict(evict="adakv", evict_at="prefill", ratio=0.5)),
        ("embedded-zh", "zh", dict(evict="knorm", evict_at="decode", budget=12, interval=2)),
    ],
)
def test_the_forced_reading_quotes_both_caches_reading_the_full_answer(model_name, lang, s, request):
    """Opened, the part reads the full cache's greedy answer so far through the settings' cache pass by pass (an
    EvictionRun fed it) and through the full cache (its own passes): the sentence's means are theirs."""
    model = request.getfixturevalue({"embedded": "embedded_model", "embedded-zh": "embedded_zh_model"}[model_name])
    at = start(view="eviction", prompt=PROMPT, chat=0, step=STEP, lang=lang, model=model_name, **s)
    at.session_state["x_forced"] = True
    at = at.run(timeout=300)
    assert_clean(at)
    ids = engine.Generation(model, PROMPT, chat=False).prompt_ids
    full_run = EvictionRun(model, ids, max_new_tokens=STEP)
    full_run.prefill()
    while not full_run.finished:
        full_run.step()
    answer = [step.token_id for step in full_run.steps]
    run = engine_run(model, ids, s, 1, max_new_tokens=STEP)  # its first pass; then the answer fed to it
    logits = [run.steps[0].logits] + [run.step(input_id=token).logits for token in answer[:-1]]
    evicting = float(torch.nn.functional.cross_entropy(torch.stack(logits), torch.tensor(answer)))
    full = float(
        torch.nn.functional.cross_entropy(torch.stack([step.logits for step in full_run.steps]), torch.tensor(answer))
    )
    assert abs(evicting - full) > 1e-3, "the settings cost nothing here: the sentence tests nothing"
    text = "\n".join(m.value for m in at.markdown).replace("\\", "")
    assert f"**{evicting:.3f}**" in text and f"**{full:.3f}**" in text, (evicting, full, text[-400:])
    assert f"**{abs(round(evicting, 3) - round(full, 3)):.3f}**" in text

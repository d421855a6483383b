"""Per-request cost is bounded by the host's settings: a step's peak memory does not grow with the split
count, the engine refuses split counts over its limit, and the app derives its limits from one budget.

Peak memory is read from torch's own allocator: `torch.profiler` with `profile_memory=True` records
every CPU allocation and free the allocator makes (tracemalloc does not see them), and the running sum
of those events, in time order, peaks where the most tensor memory was alive at once. Unlike the
process's resident high-water mark, it counts only this region's tensors, exactly, on any machine.
"""

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import engine
from ui.host import memory

PROMPT = list(range(100, 300))  # 200 token ids: T = L = 200 in the prefill
# Extra peak of a split prefill over the unsplit one that we allow, whatever the split count: one group
# of split outputs (at most 2**20 float32 elements, 4 MiB) with its temporaries, and a few running sums.
# Measured on the tiny Qwen3 (T = 200): 3.6, 8.2, 9.0 MiB at 16, 64, 256 splits; before: 5.2, 20.3, 80.7.
SPLIT_EXTRA_BOUND = 16 * 2**20


def peak_bytes(run) -> int:
    """The most tensor memory alive at once while `run()` runs, in bytes (allocator events, in time order)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns()
    )
    alive = peak = 0
    for event in events:
        alive += event.nbytes()  # negative for a free
        peak = max(peak, alive)
    return peak


def prefill_peak(model, kv_splits: int) -> int:
    generation = engine.Generation(
        model, PROMPT, kv_splits=kv_splits, max_new_tokens=2, capture=engine.Capture(residuals=False)
    )
    try:
        return peak_bytes(generation.prefill)
    finally:
        generation.close()


def test_the_measure_sees_tensors_alive_together():
    def two_at_once():
        a = torch.ones(2**20)
        b = torch.ones(2**21)
        del a, b
        torch.ones(2**19)

    assert peak_bytes(two_at_once) == 3 * 2**22


def test_prefill_peak_memory_does_not_grow_with_the_split_count(tiny_model):
    """Before the fix each layer kept all S partial outputs of every query row: (heads, T, S, D) per layer."""
    model = tiny_model("qwen3")  # head_dim 32: the old per-row partial outputs are large enough to see
    unsplit = prefill_peak(model, 1)
    extra = {splits: prefill_peak(model, splits) - unsplit for splits in (64, 256)}
    assert max(extra.values()) <= SPLIT_EXTRA_BOUND, {s: e / 2**20 for s, e in extra.items()}
    assert extra[256] - extra[64] <= 2 * 2**20, {s: e / 2**20 for s, e in extra.items()}  # flat past one group
    # What the old all-rows stack alone would have needed at 256 splits (per layer, float32): over the bound.
    info = model.info
    assert info.q_heads * len(PROMPT) * 256 * info.head_dim * 4 > SPLIT_EXTRA_BOUND


def test_engine_refuses_split_counts_over_its_limit(tiny_model):
    model = tiny_model("llama")
    engine.Generation(model, "fine", kv_splits=256).close()
    with pytest.raises(engine.InvalidSettingError, match="256"):
        engine.Generation(model, "too many", kv_splits=257)
    with pytest.raises(engine.InvalidSettingError, match="256"):
        engine.Generation(model, "far too many", kv_splits=20_000)


def test_budget_sets_the_app_limits(tiny_model):
    from ui.host.limits import APP_MAX_KV_SPLITS, Limits, step_limits

    info = replace(tiny_model("llama").info, layers=30, q_heads=9, head_dim=64)  # SmolLM2-135M's widths
    small, large = step_limits(Limits(step_memory_mb=16), info), step_limits(Limits(step_memory_mb=4096), info)
    assert small.max_kv_splits < large.max_kv_splits == APP_MAX_KV_SPLITS
    assert small.max_attention_tokens < large.max_attention_tokens
    # What a limit lets through fits the budget, and one more does not.
    budget = 16 * 10**6
    assert 2 * info.attention_bytes(small.max_attention_tokens, small.max_attention_tokens) <= budget
    assert 2 * info.attention_bytes(small.max_attention_tokens + 1, small.max_attention_tokens + 1) > budget


def test_heatmap_over_the_budget_is_refused_naming_the_limit(tiny_model, monkeypatch):
    from ui.host.limits import load_limits, step_limits
    from ui.runs.run import RunConfig
    from ui.runs.runner import Runner

    model = tiny_model("llama-long")  # room for a prompt longer than the limit
    monkeypatch.setenv("KVSCOPE_STEP_MEMORY_MB", "16")
    limit = step_limits(load_limits(), model.info).max_attention_tokens
    config = RunConfig(
        prompt=" ".join(["cat"] * (limit + 20)),
        chat=False,
        sampling=engine.Sampling(),
        block_size=16,
        kv_splits=1,
        policy="block",
        max_new_tokens=4,
        max_prompt_tokens=1000,
    )
    runner = Runner(model, 512, 8, limits=load_limits())
    runner.configure(config)
    runner.advance_to(1)
    assert len(runner.prompt_ids) > limit
    with pytest.raises(engine.KvscopeError, match=f"KVSCOPE_STEP_MEMORY_MB.*{limit}"):
        runner.full_attention(1, 0, 0)
    runner.close()
    monkeypatch.setenv("KVSCOPE_STEP_MEMORY_MB", "256")
    runner = Runner(model, 512, 8, limits=load_limits())
    runner.configure(config)
    runner.advance_to(1)
    probs, _ = runner.full_attention(1, 0, 0)
    assert probs.shape[0] == len(runner.prompt_ids)
    runner.close()


def test_app_clamps_split_counts_over_the_budget_with_a_message(monkeypatch):
    from tests.app_helpers import start

    monkeypatch.setenv("KVSCOPE_STEP_MEMORY_MB", "16")
    at = start(kv_splits=64, step=1)
    assert not at.exception, at.exception
    warnings = " ".join(w.value for w in at.warning).replace("\\", "")  # shown as escaped Markdown
    assert "kv_splits" in warnings and "KVSCOPE_STEP_MEMORY_MB" in warnings, warnings
    assert at.session_state["w_kv_splits"] < 64


@pytest.mark.parametrize("view, params", [("attention", {}), ("kv", {"pool": "busy"}), ("costs", {}), ("eviction", {})])
def test_a_server_short_of_memory_leaves_out_its_costliest_figures_and_says_so(view, params, monkeypatch):
    """A host whose memory the server nearly fills (here: one said to have 1 MB) gets pages that say what they
    leave out and go on working, never a failed step; with room, nothing is left out."""
    from tests.app_helpers import assert_clean, start, step_of
    from ui.text import strings

    said = strings.t("short_of_memory", left_out="").split(",")[0]  # "The server is short of memory just now"
    for host_mb, short in (("1", True), ("10000000", False)):
        monkeypatch.setenv("KVSCOPE_MEMORY_MB", host_mb)
        at = start(view=view, step=2, **params)
        assert_clean(at)
        infos = [i.value for i in at.info if said in i.value]
        assert bool(infos) == short, (host_mb, [i.value for i in at.info])
        at.button(key="b_next").click().run()
        assert_clean(at)
        assert step_of(at) == 3


@pytest.mark.parametrize(("host", "expected"), [(None, str(memory.KERNEL_CACHE_SHAPES)), ("256", "256")])
def test_the_kernel_cache_is_bounded_before_a_model_loads_unless_the_host_set_it(host, expected):
    """oneDNN reads its cache size once, when it builds its first kernel: the server sets it in the process where
    the page will load its model (a fresh one here), keeping a host's own setting."""
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    if host is not None:
        env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = host
    code = (
        "import os; from ui.host import memory; memory.tune_allocator(); "
        "print(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'])"
    )
    shown = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parent.parent,
    )
    assert shown.stdout.strip() == expected

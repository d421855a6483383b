"""What a decode step costs (engine/timing.py, viz/costs.py): bytes read for a batch, where the K/V passes the
weights, and a floor that is below every step it is shown beside."""

import pytest

from engine.reference_models import reference_info
from engine.timing import (
    DecodeTiming,
    crossover_batch,
    crossover_context,
    decode_step_bytes,
    measure_decode,
    peak_read_bandwidth,
    percentile,
)
from tests.conftest import FAMILIES
from ui.text.strings import figure_words
from viz.costs import context_growth_figure, context_growth_frame, per_token_figure, step_bytes_figure


def expected_step_bytes(info, context: int, batch: int) -> int:
    """Weights once (an untied embedding table and learned positions are read a row at a time: not counted)
    plus each request's K and V in every layer, written out from the ModelInfo's fields (gemma3's window is 8,
    so 43 and 200 positions read less in its local layers)."""
    element = {"float32": 4, "bfloat16": 2, "float16": 2}[info.dtype]
    params = info.parameters
    if not info.tied_embeddings:
        params -= info.vocab * info.hidden
    if info.positions == "learned":
        params -= info.context_limit * info.hidden
    # Each layer keeps every position, or (Gemma 3's sliding-window layers) at most its window.
    windows = info.layer_windows or (None,) * info.layers
    kept = sum(context if window is None else min(context, window) for window in windows)
    return params * element + batch * kept * 2 * info.kv_heads * info.head_dim * element


@pytest.mark.parametrize("family", FAMILIES)
def test_step_bytes_are_weights_plus_batch_times_kv(tiny_model, family):
    info = tiny_model(family).info
    for context in (1, 43, 200):
        for batch in (1, 2, 7, 64):
            assert decode_step_bytes(info, context, batch) == expected_step_bytes(info, context, batch)


def test_step_bytes_of_qwen3_0_6b_from_its_published_config():
    qwen = reference_info("Qwen3-0.6B")
    assert (qwen.layers, qwen.kv_heads, qwen.head_dim, qwen.q_heads, qwen.hidden, qwen.vocab) == (
        28,
        8,
        128,
        16,
        1024,
        151_936,
    )
    assert qwen.tied_embeddings and qwen.dtype == "bfloat16"
    assert qwen.kv_bytes_per_token == 114_688  # DESIGN.md: 2 × 28 × 8 × 128 × 2
    # Counted by hand: embedding; per layer q, k, v, o, q_norm, k_norm, the MLP's three, two norms; final norm.
    per_layer = 1024 * 2048 + 2 * 1024 * 1024 + 2048 * 1024 + 2 * 128 + 3 * 1024 * 3072 + 2 * 1024
    assert qwen.parameters == 151_936 * 1024 + 28 * per_layer + 1024
    assert decode_step_bytes(qwen, 1000, 3) == qwen.parameters * 2 + 3 * 1000 * 114_688


def test_step_bytes_of_the_embedded_model(embedded_model):
    info = embedded_model.info
    for context, batch in ((43, 1), (8192, 2), (500, 64)):
        assert decode_step_bytes(info, context, batch) == expected_step_bytes(info, context, batch)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_crossover_is_the_first_batch_and_context_where_kv_passes_weights(tiny_model, family):
    info = tiny_model(family).info
    weights = expected_step_bytes(info, 0, 1)

    def kv(context, batch):
        return expected_step_bytes(info, context, batch) - weights

    for context in (1, 5, 64, 256):
        smallest = next(b for b in range(1, 10**7) if kv(context, b) > weights)
        assert crossover_batch(info, context) == smallest
    for batch in (1, 3, 64):
        smallest = next(n for n in range(1, 10**7) if kv(n, batch) > weights)
        assert crossover_context(info, batch) == smallest


def test_crossovers_for_the_embedded_model_and_qwen3(embedded_model):
    for info in (embedded_model.info, reference_info("Qwen3-0.6B")):
        weights = expected_step_bytes(info, 0, 1)
        per_token = expected_step_bytes(info, 1, 1) - weights
        batch = next(b for b in range(1, 10**6) if b * 43 * per_token > weights)
        assert crossover_batch(info, 43) == batch
        context = next(n for n in range(1, 10**6) if n * per_token > weights)
        assert crossover_context(info, 1) == context
    assert crossover_context(embedded_model.info, 1) > embedded_model.info.context_limit  # one request: weights win


def test_percentiles_interpolate_between_sorted_values():
    values = [50.0, 10.0, 40.0, 20.0, 30.0]
    assert percentile(values, 0) == 10.0 and percentile(values, 100) == 50.0
    assert percentile(values, 50) == 30.0 and percentile(values, 10) == pytest.approx(14.0)


def test_peak_bandwidth_is_a_plausible_rate():
    assert 1e8 < peak_read_bandwidth(megabytes=16, tries=2) < 1e13  # between 0.1 GB/s and 10 TB/s


def test_the_bandwidth_probe_runs_once_per_server_and_again_on_request(tiny_model, monkeypatch):
    """Thirty pages timing their steps must not each allocate the probe's tensor: the first measurement of the
    process probes, later ones reuse its figure; "Measure again" probes anew and the better figure stays."""
    import engine.timing as timing

    figures = iter([5e12, 9e12, 7e12])  # fast enough that no step of a tiny model beats the floor
    probes = []
    monkeypatch.setattr(timing, "_bandwidths", {})
    monkeypatch.setattr(timing, "peak_read_bandwidth", lambda device: probes.append(device) or next(figures))
    model = tiny_model("llama")
    first = measure_decode(model, prompt=4, context=6, steps=2, untimed=1, prefills=1)
    second = measure_decode(model, prompt=5, context=9, steps=2, untimed=1, prefills=1)
    assert probes == ["cpu"] and first.bandwidth == second.bandwidth == 5e12
    again = measure_decode(model, prompt=5, context=9, steps=2, untimed=1, prefills=1, bandwidth_again=True)
    worse = measure_decode(model, prompt=5, context=9, steps=2, untimed=1, prefills=1, bandwidth_again=True)
    assert probes == ["cpu"] * 3 and again.bandwidth == worse.bandwidth == 9e12
    timing._bandwidths["cpu"] = 1.0  # a probe a busy moment slowed: no step could be read so slowly
    monkeypatch.setattr(timing, "peak_read_bandwidth", lambda device: probes.append(device) or 8e12)
    corrected = measure_decode(model, prompt=5, context=9, steps=2, untimed=1, prefills=1)
    assert probes == ["cpu"] * 4 and corrected.bandwidth == 8e12 and corrected.floor_holds


def test_the_probe_fits_within_a_steps_memory_budget():
    """The probe's tensor is allocated while a page waits: within the default per-step budget."""
    from engine.timing import BANDWIDTH_MIB
    from ui.host.limits import load_limits

    assert BANDWIDTH_MIB * 2**20 <= load_limits({}).step_memory_mb * 10**6


def floor_shown(timing: DecodeTiming) -> float | None:
    """The floor bar the per-token figure draws (its third bar), if any."""
    bars = per_token_figure(timing).data
    return bars[2].x[0] if len(bars) == 3 else None


def check_measurement(timing: DecodeTiming, info) -> None:
    assert len(timing.decode_ms) == 4 and all(ms > 0 for ms in timing.decode_ms)
    assert timing.step_bytes == expected_step_bytes(info, timing.decode_context, 1)
    assert timing.floor_ms == pytest.approx(1000 * timing.step_bytes / timing.bandwidth)
    shown = floor_shown(timing)
    assert (shown is not None) == timing.floor_holds
    assert shown is None or all(shown <= ms for ms in timing.decode_ms)  # a floor shown is below every step


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_floor_shown_on_tiny_models_is_below_every_measured_step(tiny_model, family):
    """A tiny model's weights (a few MB) can sit in the CPU's cache and be read faster than memory: then its
    floor does not hold and is not shown. Whatever the machine, a floor that is shown is below every step."""
    model = tiny_model(family)
    timing = measure_decode(model, prompt=8, context=12, steps=4, untimed=1, prefills=2)
    assert timing.prompt == 8 and len(timing.prefill_ms) == 2
    assert timing.decode_context == 12 + 1 + 1  # the answer so far, one untimed step, then the first timed one
    check_measurement(timing, model.info)


def test_the_embedded_models_floor_is_below_every_measured_step(embedded_model):
    """513 MiB of weights: far more than any CPU cache, so its steps read memory and its floor holds."""
    timing = measure_decode(embedded_model, prompt=30, context=43, steps=4, untimed=1, prefills=1)
    check_measurement(timing, embedded_model.info)
    assert timing.floor_holds and floor_shown(timing) == timing.floor_ms


def test_measurement_fits_the_context_limit(tiny_model):
    model = tiny_model("gpt2")  # learned positions: a position past the limit has no row
    timing = measure_decode(model, prompt=300, context=400, steps=2, untimed=1, prefills=1)
    assert timing.decode_context + 1 <= model.info.context_limit


def test_a_floor_above_a_measured_step_is_not_shown():
    timing = DecodeTiming(
        prompt=10,
        prefill_ms=(20.0,),
        decode_ms=(30.0, 5.0, 31.0),
        decode_context=11,
        step_bytes=10**8,
        bandwidth=10**10,
    )  # floor 10 ms, but one step took 5 ms
    assert timing.floor_ms == pytest.approx(10.0) and not timing.floor_holds
    bars = per_token_figure(timing).data
    assert [bar.x[0] for bar in bars] == pytest.approx([2.0, 30.0])  # prefill per token, decode median: no floor
    holds = DecodeTiming(
        prompt=10,
        prefill_ms=(20.0,),
        decode_ms=(30.0, 12.0, 31.0),
        decode_context=11,
        step_bytes=10**8,
        bandwidth=10**10,
    )
    prefill, decode, floor = per_token_figure(holds).data
    assert (prefill.x[0], decode.x[0], floor.x[0]) == pytest.approx((2.0, 30.0, 10.0))
    assert decode.error_x.array[0] == pytest.approx(percentile([30.0, 12.0, 31.0], 90) - 30.0)
    assert decode.error_x.arrayminus[0] == pytest.approx(30.0 - percentile([30.0, 12.0, 31.0], 10))
    assert not prefill.error_x.array and not floor.error_x.array  # a spread only where steps were timed


def test_step_bytes_figure_draws_weights_and_the_batch_kv_with_the_crossover(embedded_model):
    info, qwen = embedded_model.info, reference_info("Qwen3-0.6B")
    zh = figure_words("zh")
    fig = step_bytes_figure([("this", info), ("Qwen3-0.6B", qwen)], batch=3, context=43, title="t", words=zh)
    lines = {(trace.name, trace.xaxis): trace for trace in fig.data}
    for model, axis in ((info, "x"), (qwen, "x2")):
        weights = lines[(zh["bytes_weights"], axis)]
        kv = lines[(zh["bytes_kv"].format(batch=3), axis)]
        assert set(weights.y) == {expected_step_bytes(model, 0, 1) / 2**20}
        assert list(kv.y) == pytest.approx([expected_step_bytes(model, n, 3) / 2**20 - weights.y[0] for n in kv.x])
        assert max(kv.x) == model.context_limit
        now = lines[(zh["bytes_this_context"], axis)]
        assert list(now.x) == [43]
    crossings = [a.text for a in fig.layout.annotations]
    for model in (info, qwen):  # at B = 3 both cross within their limits
        assert zh["bytes_cross"].format(n=f"{crossover_context(model, 3):,}") in crossings


def test_legends_sit_above_the_plot_not_over_the_axis_titles():
    from engine.reference_models import reference_info as ref

    qwen = ref("Qwen3-0.6B")
    for fig in (
        step_bytes_figure([("q", qwen)], 1, 10, title="t", large=True),
        context_growth_figure(context_growth_frame(qwen, [1, 100, 1000]), 1000, "t", True),
    ):
        legend = fig.layout.legend
        assert legend.orientation == "h" and legend.y == 1 and legend.yanchor == "bottom"
        assert fig.layout.margin.t >= 2 * 34  # room for the title and one row of legend above the plot

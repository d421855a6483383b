"""What a decode step costs: the bytes it must read, this machine's peak read bandwidth, and steady timings.

The one owner of "bytes a decode step reads" (the app's costs view and bench/engine_bench.py both use
`decode_step_bytes`) and of the bandwidth measurement (`peak_read_bandwidth`).

A decode step of a batch of B requests reads every weight once (the batch shares them) and each request's
whole cached K/V: bytes = weights + B × context × K/V bytes per token. Reading them at the peak bandwidth
is the fastest a step can be, its floor; a floor is only shown beside steps it is below.

The first forward passes of a process are slow (kernels chosen, buffers allocated, pages faulted in):
`warm_up` runs them at load, and `measure_decode` times steps only after a few untimed ones.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass

import torch

from engine.generation import Generation
from engine.kv_cache import DEFAULT_BLOCK_SIZE, BlockTable
from engine.model import Model
from engine.model_info import ModelInfo
from engine.trace import NO_RECORD

WARM_UP_PROMPT_TOKENS = 24
WARM_UP_DECODE_STEPS = 4
# The tensor the bandwidth is read from: larger than most CPUs' last-level cache, and well within a step's
# memory budget (it is allocated for the probe's duration). A probe that read from a cache would only lower
# the floor, which stays a floor; `DecodeTiming.floor_holds` catches the opposite.
BANDWIDTH_MIB = 64
BANDWIDTH_TRIES = 5  # the best counts
TIMED_STEPS = 8
UNTIMED_STEPS = 2  # before the timed ones, at the same context
PREFILL_TRIES = 3
MEASURE_BLOCK = DEFAULT_BLOCK_SIZE
_measuring = threading.Lock()  # one measurement at a time per process: they would slow each other down


# -- bytes ----------------------------------------------------------------------------------------------------


def weight_bytes_read(info: ModelInfo) -> int:
    """Bytes of weights one forward pass reads: every parameter, except lookup tables of which it reads one
    row: an untied embedding table (a tied one is read whole, as lm_head) and GPT-2's learned positions."""
    unread = 0 if info.tied_embeddings else info.vocab * info.hidden
    if info.positions == "learned":
        unread += info.context_limit * info.hidden
    return (info.parameters - unread) * info.element_bytes


def decode_step_bytes(info: ModelInfo, context: int, batch: int = 1) -> int:
    """Bytes one decode step reads for `batch` requests of `context` cached positions each: the weights once,
    plus every request's K/V (a sliding-window layer's at most its window: `ModelInfo.kv_bytes`)."""
    return weight_bytes_read(info) + batch * info.kv_bytes(context)


def crossover_batch(info: ModelInfo, context: int) -> int:
    """The smallest batch whose K/V at `context` positions each is more than the weights (context ≥ 1)."""
    return weight_bytes_read(info) // info.kv_bytes(context) + 1


def crossover_context(info: ModelInfo, batch: int) -> int:
    """The smallest context at which `batch` requests' K/V is more than the weights (may exceed the model's
    limit). Past a sliding window only the global layers' K/V grow; with none, the K/V never pass the weights
    (the model's context limit + 1 is returned)."""
    weights = weight_bytes_read(info)
    context = weights // (batch * info.kv_bytes_per_token) + 1  # while every layer still grows
    window = info.sliding_window
    if window is None or context <= window:
        return context
    per_global = info.kv_bytes(window + 1) - info.kv_bytes(window)  # a position more, in the global layers only
    if per_global == 0:
        return info.context_limit + 1
    fixed = info.kv_bytes(window) - window * per_global  # the local layers' full windows
    return max(window + 1, (weights - batch * fixed) // (batch * per_global) + 1)


# -- bandwidth ------------------------------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_read_bandwidth(
    device: torch.device | str = "cpu", megabytes: int = BANDWIDTH_MIB, tries: int = BANDWIDTH_TRIES
) -> float:
    """Bytes per second: the best of `tries` sums over a `megabytes` float32 tensor on `device`.

    torch splits such a sum over all its threads (on a GPU, all its cores), each reading its part: a read at
    the machine's multithreaded peak, with the same threads a forward pass uses. The best try is the one
    least disturbed by other work, so bytes ÷ this is a floor no step that reads those bytes can beat.
    """
    device = torch.device(device)
    x = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32, device=device)
    x.sum()  # fault the pages in before timing
    best = float("inf")
    for _ in range(tries):
        _sync(device)
        start = time.perf_counter()
        x.sum()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return x.numel() * x.element_size() / best


_bandwidths: dict[str, float] = {}  # device → the best peak read bandwidth this process has measured


def server_bandwidth(device: str, again: bool = False) -> float:
    """`peak_read_bandwidth` of `device` ("cpu", "cuda:0"), measured once per process and kept (pages of a
    class that open the costs view at once would otherwise each allocate the probe's tensor); `again` measures
    anew and keeps the better figure, so a probe a busy moment slowed is corrected. Call it under
    `_measuring`: one caller measures, the others wait for its figure."""
    if again or device not in _bandwidths:
        _bandwidths[device] = max(_bandwidths.get(device, 0.0), peak_read_bandwidth(device))
    return _bandwidths[device]


# -- timings --------------------------------------------------------------------------------------------------


def percentile(values: list[float] | tuple[float, ...], p: float) -> float:
    """The p-th percentile (0–100), linear between the sorted values."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class DecodeTiming:
    """Steady timings of one request's steps, and the peak read bandwidth measured between them.
    Milliseconds; bandwidth in bytes per second."""

    prompt: int  # tokens of each timed prefill
    prefill_ms: tuple[float, ...]  # each timed prefill
    decode_ms: tuple[float, ...]  # each timed decode step
    decode_context: int  # positions the first timed decode step reads (the fewest of them)
    step_bytes: int  # what that step reads: decode_step_bytes(info, decode_context)
    bandwidth: float

    @property
    def prefill_ms_per_token(self) -> float:
        return statistics.median(self.prefill_ms) / self.prompt

    @property
    def decode_median(self) -> float:
        return statistics.median(self.decode_ms)

    @property
    def decode_spread(self) -> tuple[float, float]:
        """(p10, p90) of the timed steps."""
        return percentile(self.decode_ms, 10), percentile(self.decode_ms, 90)

    @property
    def floor_ms(self) -> float:
        """The fastest a decode step can be: its bytes read once at the peak bandwidth."""
        return 1000 * self.step_bytes / self.bandwidth

    @property
    def floor_holds(self) -> bool:
        """Whether the floor is below every timed step. If not, the bandwidth was under-measured (or a step
        read less than its bytes, e.g. from a cache), and the floor must not be shown as one."""
        return self.floor_ms <= min(self.decode_ms)


def _filler_ids(info: ModelInfo, count: int) -> list[int]:
    """Token ids 1, 2, 3 … (repeating below the vocabulary size): what they say does not change the time."""
    return [1 + i % (info.vocab - 1) for i in range(count)]


def measure_decode(
    model: Model,
    prompt: int,
    context: int,
    steps: int = TIMED_STEPS,
    untimed: int = UNTIMED_STEPS,
    prefills: int = PREFILL_TRIES,
    bandwidth_again: bool = False,
) -> DecodeTiming:
    """Steady timings in a scratch pool (nothing is kept): a prefill of `prompt` tokens, timed `prefills` times;
    then, with `context` positions cached (≥ prompt), `steps` decode steps after `untimed` ones, beside the
    server's peak read bandwidth (`server_bandwidth`: measured by the first timing of the process, and anew
    with `bandwidth_again` or when a step read its bytes faster than the figure kept allows).

    A pass records nothing beyond its logits (no attention, no residuals): the time is the model's own. Lengths
    are cut to fit the model's context limit.
    """
    info, device = model.info, model.device
    context = max(1, min(context, info.context_limit - untimed - steps))
    prompt = max(1, min(prompt, context))
    total = context + untimed + steps
    pool = model.new_pool(-(-total // MEASURE_BLOCK), MEASURE_BLOCK)
    ids = _filler_ids(info, total)

    def run(table: BlockTable, count: int) -> float:
        """One pass over the next `count` positions of `table`; its milliseconds."""
        start = table.length
        table.append(count)
        _sync(device)
        clock = time.perf_counter()
        model.forward(ids[start : start + count], list(range(start, start + count)), table, NO_RECORD)
        _sync(device)
        table.slide()
        return 1000 * (time.perf_counter() - clock)

    with _measuring:
        bandwidth = server_bandwidth(str(device), bandwidth_again)
        prefill_ms = []
        for _ in range(prefills):
            table = BlockTable(pool)
            prefill_ms.append(run(table, prompt))
            if len(prefill_ms) < prefills:
                table.free()
        if context > prompt:
            run(table, context - prompt)  # the answer so far, untimed
        for _ in range(untimed):
            run(table, 1)
        decode_context = table.length + 1
        decode_ms = [run(table, 1) for _ in range(steps)]
        step_bytes = decode_step_bytes(info, decode_context)
        if 1000 * step_bytes / bandwidth > min(decode_ms):  # the kept figure is under what a step just read:
            bandwidth = server_bandwidth(str(device), again=True)  # probed in a busy moment; probe anew
    return DecodeTiming(
        prompt=prompt,
        prefill_ms=tuple(prefill_ms),
        decode_ms=tuple(decode_ms),
        decode_context=decode_context,
        step_bytes=step_bytes,
        bandwidth=bandwidth,
    )


def warm_up(model: Model) -> Model:
    """One short prefill and a few decode steps in a scratch pool that is freed afterwards; returns `model`.

    Runs the same code path as a real generation (attention recorded), so the timed steps that follow are
    steady-state. Nothing is published or kept.
    """
    ids = list(range(1, min(WARM_UP_PROMPT_TOKENS, model.info.vocab - 1) + 1))
    with Generation(model, ids, max_new_tokens=WARM_UP_DECODE_STEPS + 1) as generation:
        generation.prefill()
        for _ in range(WARM_UP_DECODE_STEPS):
            if generation.finished:
                break
            generation.step()
    return model

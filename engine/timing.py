"""Steady-state timing: warm a model up before anyone times it, and measure this machine's memory bandwidth.

The first forward passes of a process are slow (kernels chosen, buffers allocated, pages faulted in):
without a warm-up, a class's first decode steps time the machine's start-up rather than decoding.
"""

from __future__ import annotations

import functools
import statistics
import time

import torch

from engine.model import Model
from engine.session import DecodeSession

WARM_UP_PROMPT_TOKENS = 24
WARM_UP_DECODE_STEPS = 4


def warm_up(model: Model) -> Model:
    """One short prefill and a few decode steps in a scratch pool that is freed afterwards; returns `model`.

    Runs the same code path as a real session (attention recorded), so the timed steps that follow are
    steady-state. Nothing is published or kept.
    """
    ids = list(range(1, min(WARM_UP_PROMPT_TOKENS, model.info.vocab - 1) + 1))
    with DecodeSession(model, ids, max_new_tokens=WARM_UP_DECODE_STEPS + 1) as session:
        session.prefill()
        for _ in range(WARM_UP_DECODE_STEPS):
            if session.finished:
                break
            session.step()
    return model


@functools.cache
def memory_bandwidth(megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes per second this process reads from memory: the median time to sum a `megabytes` float32
    tensor (far larger than any CPU cache), measured once per process."""
    x = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32)
    x.sum()  # fault the pages in before timing
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        x.sum()
        times.append(time.perf_counter() - start)
    return x.numel() * x.element_size() / statistics.median(times)

"""Teacher-forced NLL of a given text read through a streaming window: StreamingLLM's experiment (NLL by position
over a long text: the full cache, a recent window alone, sinks plus the window).

A `StreamingWindow` keeps by position, so what the pass at each position reads does not depend on the model:
`StreamingWindow.reads` gives it for every position at once, and one pass over many positions masks each query
with its own row. That equals reading the text pass by pass through an `EvictionRun` (`run.step(input_id)`), in a
fraction of the time (tests/test_eviction.py checks both against transformers' eager attention, masked alike).
Keys keep the positions they were rotated at, as everywhere in `engine.eviction`; sliding-window layers (Gemma 3's
local ones) keep their own window.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from engine.errors import InvalidSettingError
from engine.eviction.run import StreamingWindow
from engine.kv_cache import DEFAULT_BLOCK_SIZE, BlockTable
from engine.model import Model
from engine.settings import require_integer
from engine.trace import NO_RECORD


def stream_nll(model: Model, ids: list[int], window: StreamingWindow | None = None, chunk: int = 256,
               block_size: int = DEFAULT_BLOCK_SIZE) -> torch.Tensor:
    """(len(ids) − 1,) float32, in nats: entry p is −log p(ids[p + 1]), from the logits of the pass at position p
    reading what `window` leaves it (None: the full cache). Passes of `chunk` positions each (the memory of one
    pass grows with chunk × len(ids))."""
    if len(ids) < 2:
        raise InvalidSettingError(f"the NLL of a text needs at least 2 tokens, got {len(ids)}")
    if len(ids) - 1 > model.info.context_limit:
        raise InvalidSettingError(f"{model.info.name} reads at most {model.info.context_limit} positions; the text "
                                  f"needs {len(ids) - 1}")
    require_integer("chunk", chunk, 1)
    n = len(ids) - 1  # positions 0 … n − 1 each predict the next id
    reads = window.reads(n).to(model.device) if window is not None else None
    targets = torch.tensor(ids[1:], device=model.device)
    table = BlockTable(model.new_pool(math.ceil(n / block_size), block_size))
    nll = []
    try:
        for start in range(0, n, chunk):
            end = min(start + chunk, n)
            table.append(end - start)
            kept = None
            if reads is not None:  # one row per query, shared by every KV head of every global layer
                rows = reads[start:end, :end][None]  # (1, T, L)
                kept = [rows if model.info.window(i) is None else None for i in range(model.info.layers)]
            hidden = model.forward(ids[start:end], list(range(start, end)), table, NO_RECORD, kept=kept, head=False)
            table.slide()
            with torch.inference_mode():
                nll.append(F.cross_entropy(model.logits(hidden), targets[start:end], reduction="none"))
    finally:
        table.free()
    return torch.cat(nll).cpu()

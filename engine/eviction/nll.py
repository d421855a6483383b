"""Teacher-forced NLL of a given text read through an evicting cache: through a streaming window, StreamingLLM's
experiment (NLL by position over a long text: the full cache, a recent window alone, sinks plus the window,
`stream_nll`); after a prompt, through the cache any policy leaves it (`forced_nll`).

A `StreamingWindow` keeps by position, so what the pass at each position reads does not depend on the model:
`StreamingWindow.reads` gives it for every position at once, and one pass over many positions masks each query
with its own row. That equals reading the text pass by pass through an `EvictionRun` (`run.step(input_id)`), in a
fraction of the time (tests/test_eviction.py checks both against transformers' eager attention, masked alike).
Keys keep the positions they were rotated at, as everywhere in `engine.eviction`, unless `rerotate`: the paper's
positions inside the cache, where the pass at p holds the sinks at 0 … s − 1 and its window right after them, so
the gap between the last sink and the window closes. Window and query keep their distances (RoPE sees only
those); each sink moves up by t_p = max(0, p − window − s) (`StreamingWindow.sink_turns`), which a chunked pass
computes by scoring the sinks against each query turned back by its own t_p. Sliding-window layers (Gemma 3's
local ones) keep their own window.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from engine.checks import require_integer
from engine.errors import InvalidSettingError
from engine.eviction.budgets import DecodeBudget, StreamingWindow
from engine.eviction.policies import Policy
from engine.eviction.run import EvictionRun
from engine.kv_cache import DEFAULT_BLOCK_SIZE, BlockTable
from engine.model import Model
from engine.passes import Pass
from engine.trace import NO_RECORD


def stream_nll(
    model: Model,
    ids: list[int],
    window: StreamingWindow | None = None,
    chunk: int = 256,
    block_size: int = DEFAULT_BLOCK_SIZE,
    rerotate: bool = False,
) -> torch.Tensor:
    """(len(ids) − 1,) float32, in nats: entry p is −log p(ids[p + 1]), from the logits of the pass at position p
    reading what `window` leaves it (None: the full cache). Passes of `chunk` positions each (the memory of one
    pass grows with chunk × len(ids)). `rerotate`: positions inside the cache, as the StreamingLLM paper numbers
    them (see the module docstring)."""
    if len(ids) < 2:
        raise InvalidSettingError(f"the NLL of a text needs at least 2 tokens, got {len(ids)}")
    if len(ids) - 1 > model.info.context_limit:
        raise InvalidSettingError(
            f"{model.info.name} reads at most {model.info.context_limit} positions; the text needs {len(ids) - 1}"
        )
    require_integer("chunk", chunk, 1)
    if rerotate and (window is None or model.info.positions == "learned"):
        raise InvalidSettingError("positions inside the cache need a streaming window and rotary positions")
    n = len(ids) - 1  # positions 0 … n − 1 each predict the next id
    reads = window.reads(n).to(model.device) if window is not None else None
    turns = window.sink_turns(n).to(model.device) if rerotate else None
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
            sinks = (window.n_sink, turns[start:end]) if turns is not None and window.n_sink else None
            one = Pass(ids[start:end], list(range(start, end)), table, NO_RECORD, kept=kept, sink_turns=sinks)
            hidden = model.forward_batch([one], head=False)[0]
            table.slide()
            with torch.inference_mode():
                nll.append(F.cross_entropy(model.logits(hidden), targets[start:end], reduction="none"))
    finally:
        table.free()
    return torch.cat(nll).cpu()


def forced_nll(
    model: Model,
    prompt_ids: list[int],
    text_ids: list[int],
    policy: Policy | None = None,
    *,
    compression_ratio: float = 0.0,
    budget: DecodeBudget | StreamingWindow | None = None,
    rerotate: bool = False,
    one_pass: bool | None = None,
) -> torch.Tensor:
    """(len(text_ids),) float32, in nats: −log p of each of `text_ids` after `prompt_ids`, read through the cache an
    `EvictionRun` of the prompt holds under these settings, teacher forced (the given text, not the run's own): the
    prompt's context prefilled and evicted as the run does, its last token's pass predicting text_ids[0], then one
    pass per token of the text, evicting to `budget` as the run would. Where nothing evicts after the prefill (no
    budget, no re-rotation), the text after its first token is read in one pass over the kept rows instead (unless
    `one_pass` is False), which equals those passes (tests/test_eviction_presses.py) up to rounding: in bfloat16 a
    comparison of two caches reads both the same way."""
    if not text_ids:
        raise InvalidSettingError("the NLL of a text needs at least 1 token after the prompt")
    run = EvictionRun(
        model,
        prompt_ids,
        policy,
        compression_ratio=compression_ratio,
        budget=budget,
        max_new_tokens=len(text_ids),
        keep_full_steps=1,
        rerotate=rerotate,
    )
    try:
        rows = [run.prefill().logits[None]]
        if one_pass is None:
            one_pass = budget is None and not rerotate
        elif one_pass and (budget is not None or rerotate):
            raise InvalidSettingError("a text is read in one pass only where nothing evicts after the prefill")
        if one_pass:
            if len(text_ids) > 1:
                rows.append(_read_in_one_pass(run, text_ids[:-1]))
        else:
            rows += [run.step(input_id=token).logits[None] for token in text_ids[:-1]]
        with torch.inference_mode():
            return F.cross_entropy(
                torch.cat(rows).float(), torch.tensor(text_ids, device=model.device), reduction="none"
            ).cpu()
    finally:
        run.close()


def _read_in_one_pass(run: EvictionRun, ids: list[int]) -> torch.Tensor:
    """(len(ids), vocab) logits: `ids` after the run's cache in one pass, each position reading what the run's rows
    kept of the cache before it and every position of `ids` up to itself (nothing evicts in between)."""
    model, start = run.model, run.table.length
    length = start + len(ids)
    run.table.append(len(ids))
    for rows in run.rows.values():
        rows.append(start, len(ids))
    kept = [run.rows[i].mask(length) if i in run.rows else None for i in range(model.info.layers)]
    hidden = model.forward_batch([Pass(ids, list(range(start, length)), run.table, NO_RECORD, kept=kept)], head=False)[
        0
    ]
    run.table.slide()
    with torch.inference_mode():
        return model.logits(hidden)

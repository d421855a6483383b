"""Computed runs that pages read: a `Run` (a decode session on its prefix cache, and what pages computed from it)
and the `RunStore` that shares runs between pages with the same settings and prompt history.

Plain Python (no Streamlit). `step` counts generated tokens: 0 is the prompt alone, 1 is after the prefill.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from cachetools import LRUCache

import engine
from engine.busy_pool import BusyPoolPicture, BusyPoolReplay
from engine.tokens import TokenCell, candidate_cells, token_cells
from engine.trace import StepTrace

CAPTURE = engine.Capture(attention_budget=1_000_000)  # a prefill keeps at most 4 MB each of probs and scores


@dataclass(frozen=True)
class RunConfig:
    prompt: str
    chat: bool
    sampling: engine.Sampling
    block_size: int
    kv_splits: int
    policy: str
    max_new_tokens: int
    max_prompt_tokens: int
    think: bool = False  # a template's thinking switch (Qwen3); templates without one never see it


Seeds = tuple[tuple[int, ...], ...]  # prompts (token ids) a run's prefix cache holds before its own prefill
RunKey = tuple[RunConfig, Seeds]
SEED_CAPTURE = engine.Capture(attention=False, residuals=False)  # a seed prompt's prefill only fills the cache
# A run's traces that keep their tensors hold at most this (with the newest always): an ordinary run keeps the
# latest KVSCOPE_FULL_TRACES or a few fewer (SmolLM2: ~1.5 MB a step at 500 positions; Gemma, its 262,144 logits:
# ~2.5 MB), a run in 64 KV splits (~6.5 MB a step, its split record) one or two: a class's heaviest links held
# eight. An older step is rebuilt by one forward pass when a page goes back to it.
TRACE_BYTES = 12 * 10**6
MEMO = 4  # rebuilt steps and attention heatmaps a run keeps for the pages reading it
# A run no page has asked for this long is dropped from the store: a class that left (tabs closed) hands its runs
# back within minutes instead of holding them until the store fills. A page reads its run on every press, and a
# page left open keeps the run it holds.
IDLE_SECONDS = 300


class Run:
    """One computed run: a decode session on a prefix cache, and what pages computed from it (rebuilt older steps,
    full attention heatmaps). A run is fully determined by its config and its cache's starting content (`seeds`),
    so pages with the same ones can read one run; stepping further extends it for all of them (under `lock`).

    cache: the class's shared prefix cache, or None for a cache of the run's own that first prefills `seeds`
    (the prompts its page published before, in order).
    """

    def __init__(self, model: engine.Model, config: RunConfig, keep_full_traces: int, pool_tokens: int,
                 seeds: Seeds = (), cache: engine.PrefixCache | None = None):
        self.model = model
        self.config = config
        self.seeds = seeds
        self.lock = threading.RLock()  # stepping; a shared pool has its own lock for bookkeeping
        if cache is None:
            tokens = max(pool_tokens, config.max_prompt_tokens + config.max_new_tokens)  # always one longest run
            cache = engine.PrefixCache(model, policy=config.policy, block_size=config.block_size,
                                       capacity_blocks=-(-tokens // config.block_size) + 2)
            for ids in seeds:
                with engine.DecodeSession(model, list(ids), prefix_cache=cache, max_new_tokens=1,
                                          keep_full_traces=1, capture=SEED_CAPTURE) as seed:
                    seed.prefill()  # closing publishes its prompt's K/V
        self.cache = cache
        session = engine.DecodeSession(
            model, config.prompt, chat=config.chat, think=config.think, sampling=config.sampling,
            block_size=config.block_size, max_new_tokens=config.max_new_tokens, kv_splits=config.kv_splits,
            prefix_cache=cache, keep_full_traces=keep_full_traces, full_trace_bytes=TRACE_BYTES, capture=CAPTURE)
        if len(session.prompt_ids) > config.max_prompt_tokens:
            session.close()
            raise engine.PromptTooLongError(f"the prompt is {len(session.prompt_ids)} tokens; this app allows "
                                            f"at most {config.max_prompt_tokens}")
        self.session = session
        self._rebuilt = Memo()  # step → its rebuilt trace
        self._attention = Memo()  # (layer, head) → (probs, scores)
        self._cells = Memo()  # tokens generated → the token cells
        self._candidates = Memo()  # (step, candidate ids) → their cells
        self._busy: BusyPoolReplay | None = None  # this run replayed in a busy pool, as far as a page asked
        self._busy_pictures: list[BusyPoolPicture] = []  # step s's picture at s − 1 (plain data)

    def advance_to(self, step: int) -> int:
        """Run prefill/decode until `step` tokens exist (or the run ends); return the step reached."""
        with self.lock:
            session = self.session
            if step >= 1 and not session.traces:
                session.prefill()
            while len(session.generated) < step and not session.finished:
                session.step()
            return min(step, len(session.generated))

    def trace(self, step: int) -> StepTrace | None:
        """The trace that produced token `step` (1-based), with its tensors: if it was slimmed, rebuilt by one
        forward pass over the K/V the run's cache holds (kept for the next pages that draw it)."""
        if step < 1 or step > len(self.session.traces):
            return None
        trace = self.session.traces[step - 1]
        if not trace.is_slim:
            return trace
        with self.lock:
            return self._rebuilt.made(step, lambda: self.session.rebuild(step - 1))

    @functools.cached_property
    def prompt_text(self) -> str:
        """The prompt as the model read it (its template's text included)."""
        return self.model.tokenizer.decode(self.session.prompt_ids)

    def cells(self, step: int) -> list[TokenCell]:
        """The prompt's tokens and the first `step` generated ones, one cell each: made once for every page that
        draws this step (a class following one teacher), and only read by them."""
        session = self.session
        count = min(step, len(session.generated))  # a step not reached yet is never kept under its number
        return self._cells.made(count, lambda: token_cells(self.model.tokenizer, session.prompt_ids,
                                                           session.generated[:count]))

    def candidate_cells(self, step: int, candidate_ids: list[int]) -> list[TokenCell]:
        """The candidates for token `step` (1-based), each as the cell it would become after the tokens before it
        (see `engine.tokens.candidate_cells`); made once for every page that draws them, and only read."""
        def made() -> list[TokenCell]:
            session = self.session
            context = (session.prompt_ids + session.generated)[:len(session.prompt_ids) + step - 1]
            return candidate_cells(self.model.tokenizer, context, candidate_ids)

        return self._candidates.made((step, tuple(candidate_ids)), made)

    def full_attention(self, step: int, layer: int, head: int):
        """Probabilities and scores (n, n) of one head of `layer` over the sequence step `step` attended.

        Computed once by a fresh prefill, then grown row by row from the decode steps' own recorded
        rows, so stepping forward costs one row, not a prefill. Only the shown heads are kept.
        """
        session = self.session
        n = len(session.prompt_ids) + max(0, step - 1)
        with self.lock:
            kept = self._attention.get((layer, head))
            if kept is not None:
                probs, scores = kept
                while probs.shape[0] < n and (row := self._decode_row(probs.shape[0] + 1, layer, head)) is not None:
                    probs, scores = _grow(probs, row[0], 0.0), _grow(scores, row[1], float("-inf"))
                self._attention.put((layer, head), (probs, scores))
                if probs.shape[0] >= n:
                    return probs[:n, :n], scores[:n, :n]
            probs, scores = self.model.full_attention(session.ids[:n], layer, self.config.block_size)
            return self._attention.put((layer, head), (probs[head].clone(), scores[head].clone()))

    def _decode_row(self, length: int, layer: int, head: int):
        """The row a decode step recorded when the sequence reached `length` positions, if still kept."""
        index = length - len(self.session.prompt_ids)  # traces[index] is that decode step
        if not 1 <= index < len(self.session.traces):
            return None
        trace = self.session.traces[index]
        if trace.is_slim:
            return None
        return trace.attention[layer, head, 0], trace.scores[layer, head, 0]

    def cached_kv(self, layer: int, length: int):
        """What this run's cache holds for `layer` among the first `length` positions: K and V, (n, kv_heads,
        head_dim) each, and the position they start at. A global layer holds them all (start 0); a sliding-window
        layer (Gemma 3) only its last positions, in whole blocks, and none (n = 0, start ≥ `length`) at an early
        step the window has long passed."""
        with self.lock:
            k, v, start = self.session.table.read(layer)
        held = max(0, length - start)
        return k[:held], v[:held], start

    def busy_pool(self, step: int) -> BusyPoolPicture:
        """The first `step` steps of this run replayed in a pool other requests used first (engine.busy_pool),
        compared with this run's own K/V. One replay per run, a pass further for each step further than any
        page asked before, and every step's picture kept: going back costs no forward pass."""
        with self.lock:
            session = self.session
            if self._busy is None:
                prompt = session.prompt_ids
                self._busy = BusyPoolReplay(self.model, [(prompt, list(range(len(prompt))))], self.config.block_size,
                                            capacity=len(prompt) + self.config.max_new_tokens)
            replay, pictures = self._busy, self._busy_pictures
            while len(pictures) < max(1, step):
                if pictures:  # step 1's pass is the prefill, made with the replay
                    trace = session.traces[len(pictures)]
                    replay.add(trace.input_ids, trace.positions)
                pictures.append(replay.picture(lambda layer: self.cached_kv(layer, replay.table.length)))
            return pictures[max(1, step) - 1]

    @property
    def nbytes(self) -> int:
        """What this run holds: its traces' tensors, the K/V of its cache's written blocks, its memos."""
        pool = self.cache.pool
        kv = (pool.used_blocks + self.cache.cached_free_blocks()) * pool.block_size * pool.bytes_per_token
        memo = sum(t.nbytes for t in self._rebuilt.values())
        memo += sum(p.nbytes + s.nbytes for p, s in self._attention.values())  # a copy: other pages add to it
        memo += self._busy.nbytes if self._busy is not None else 0
        return sum(t.nbytes for t in self.session.traces) + kv + memo

    @property
    def closed(self) -> bool:
        return self.session.closed

    def close(self) -> None:
        """Publish the prompt to the cache (if prefilled) and give the blocks back: for a run on the class's cache."""
        with self.lock:
            self.session.close()
            self._busy, self._busy_pictures = None, []


class RunStore:
    """The runs of one model that pages share: least recently used first, bounded in bytes (`max_bytes`).

    A run is built once per key, under a lock of that key (pages asking at once wait for the one build). A page
    keeps the run it reads even after the store dropped it; the store only stops handing it out.
    """

    def __init__(self, max_bytes: int, idle_seconds: float = IDLE_SECONDS, clock: Callable[[], float] = time.monotonic):
        self.max_bytes = max_bytes
        self.idle_seconds = idle_seconds
        self.built = 0  # runs built so far
        self._clock = clock
        self._lock = threading.Lock()  # guards the three dicts below
        self._runs: OrderedDict[RunKey, Run] = OrderedDict()
        self._read_at: dict[RunKey, float] = {}
        self._building: dict[RunKey, threading.Lock] = {}

    def get(self, key: RunKey, build: Callable[[], Run]) -> Run:
        with self._lock:
            building = self._building.setdefault(key, threading.Lock())
        try:
            with building:
                with self._lock:
                    run = self._runs.get(key)
                    if run is not None:
                        self._runs.move_to_end(key)
                        self._read_at[key] = self._clock()
                        return run
                run = build()  # may raise (a prompt too long): nothing is stored
                with self._lock:
                    self._runs[key] = run
                    self._read_at[key] = self._clock()
                    self.built += 1
        finally:
            with self._lock:  # a key's build lock lives while it is asked for, not for every key ever read
                if self._building.get(key) is building and not building.locked():
                    del self._building[key]
        self.trim()
        return run

    def trim(self) -> None:
        """Drop the least recently used runs until the others fit in `max_bytes` (the newest always stays)."""
        with self._lock:
            runs = list(self._runs.items())
        sizes = {key: run.nbytes for key, run in runs}  # outside the store's lock: a run's size reads its pool
        total = sum(sizes.values())
        with self._lock:
            for key, _ in runs[:-1]:
                if total <= self.max_bytes:
                    break
                if self._runs.pop(key, None) is not None:
                    self._read_at.pop(key, None)
                    total -= sizes[key]

    def touch(self, run: Run) -> None:
        """`run` was read by a page that holds it: it is not idle (a no-op once the store dropped it)."""
        with self._lock:
            for key in self._read_at:
                if self._runs[key] is run:
                    self._read_at[key] = self._clock()
                    return

    def expire(self) -> int:
        """Drop the runs no page has asked for in `idle_seconds` (the pages of closed tabs; a page still open keeps
        the run it reads); returns how many were dropped. Called every so often by the server's sweeper."""
        cutoff = self._clock() - self.idle_seconds
        with self._lock:
            idle = [key for key, read_at in self._read_at.items() if read_at <= cutoff]
            for key in idle:
                del self._runs[key], self._read_at[key]
        return len(idle)

    @property
    def keys(self) -> list[RunKey]:
        """The keys of the runs kept, least recently used first."""
        with self._lock:
            return list(self._runs)



class Memo:
    """A least-recently-used memo of `size` values that pages may read while others add to it (the store sizes runs
    without their locks)."""

    def __init__(self, size: int = MEMO):
        self._values: LRUCache = LRUCache(size)
        self._lock = threading.Lock()

    def get(self, key):
        with self._lock:
            return self._values.get(key)  # a hit counts as a use

    def put(self, key, value):
        with self._lock:
            self._values[key] = value
        return value

    def made(self, key, build: Callable):
        """The value kept under `key`, or `build()`'s, kept (built outside the lock: pages asking at once may each
        build it, and one is kept)."""
        value = self.get(key)
        return self.put(key, build()) if value is None else value

    def values(self) -> list:
        with self._lock:
            return list(self._values.values())

    def clear(self) -> None:
        with self._lock:
            self._values.clear()


def _grow(matrix, row, future: float):
    """Append one query row (length n+1) to an n × n causal matrix; earlier rows get `future` for the
    new key they cannot see (0 for probabilities, −inf for scores)."""
    n = matrix.shape[0]
    grown = matrix.new_full((n + 1, n + 1), future)
    grown[:n, :n] = matrix
    grown[n] = row
    return grown

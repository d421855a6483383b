"""The runs pages read: a `Run` (a decode session on its prefix cache), the `RunStore` that shares runs
between pages, and each browser session's `Runner` (its settings, its run, the prompts it published).

Plain Python (no Streamlit), so the app's step logic is tested like the engine. `step` counts
generated tokens: 0 is the prompt alone, 1 is after the prefill (which yields the first token).
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

import engine
from engine.busy_pool import BusyPoolPicture, BusyPoolReplay
from engine.prefix_cache import PolicyReuse, PromptHistory
from engine.prompt import PromptSegment, has_chat_template, prompt_segments, template_can_think
from engine.split_kv import split_demo
from engine.timing import DecodeTiming, measure_decode
from engine.tokens import TokenCell, candidate_cells, token_cells
from engine.trace import PrefixHit, SplitKVTrace, StepTrace
from ui.settings import Limits, load_limits, step_limits

CLASSROOM_CACHES = 3  # (policy, block size) pools a class keeps; the least recently used is dropped first
CAPTURE = engine.Capture(attention_budget=1_000_000)  # a prefill keeps at most 4 MB each of probs and scores


class ClassroomCache:
    """One prefix cache per (policy, block size) for the whole class, when the host turns it on.

    Sessions then reuse each other's prompt K/V. At most `max_caches` pools are kept: asking for
    another drops the least recently used one (runs still using it keep it until they close).
    Each cache's pool has its own lock, held only for bookkeeping (see engine.kv_cache), so one
    student's long prefill does not hold up another's step.

    Blocks come back when a student is gone: a runner that is garbage-collected (Streamlit drops a
    session's state when its browser session ends) leaves its decode session in `orphaned`, closed at
    the class's next check-in rather than inside the collector, which may run in the middle of a pool's
    bookkeeping. And a runner checks in on each use: one not seen for `lease_seconds` (a tab left open,
    a session Streamlit has not ended yet) has its session closed; when the student returns, the runner
    rebuilds it from its settings.
    """

    def __init__(self, model: engine.Model, tokens: int, lease_seconds: float = Limits.lease_seconds,
                 max_caches: int = CLASSROOM_CACHES, clock: Callable[[], float] = time.monotonic):
        self.model = model
        self.tokens = tokens
        self.lease_seconds = lease_seconds
        self.max_caches = max_caches
        self.clock = clock  # seconds; injectable for tests
        self._lock = threading.Lock()  # guards the two dicts below, nothing else
        self._caches: OrderedDict[tuple[str, int], engine.PrefixCache] = OrderedDict()  # oldest use first
        self._seen: weakref.WeakKeyDictionary[Runner, float] = weakref.WeakKeyDictionary()
        self.orphaned: deque[engine.DecodeSession] = deque()  # appended by finalizers: no lock needed

    def get(self, policy: str, block_size: int) -> engine.PrefixCache:
        with self._lock:
            key = (policy, block_size)
            cache = self._caches.pop(key, None)
            if cache is None:
                cache = engine.PrefixCache(self.model, policy=policy, block_size=block_size,
                                           capacity_blocks=-(-self.tokens // block_size))
            self._caches[key] = cache
            while len(self._caches) > self.max_caches:
                self._caches.popitem(last=False)
            return cache

    @property
    def kept(self) -> list[tuple[str, int]]:
        """The (policy, block size) of the caches kept, least recently used first."""
        with self._lock:
            return list(self._caches)

    def check_in(self, runner: Runner) -> None:
        """Renew `runner`'s lease, then close the sessions of runners that are gone or whose lease ran out."""
        self.reclaim()
        now = self.clock()
        with self._lock:
            self._seen[runner] = now
            stale = [(other, seen) for other, seen in self._seen.items() if now - seen > self.lease_seconds]
        for other, seen in stale:
            self._expire(other, seen)

    def reclaim(self, collect: bool = False) -> int:
        """Close the sessions of runners that were garbage-collected: their blocks go back to the pool.

        collect: first run the cycle collector, for ended browser sessions held only in reference cycles
        (a cost worth paying only when the pool is full). Returns how many sessions were closed.
        """
        if collect:
            gc.collect()
        closed = 0
        while self.orphaned:
            self.orphaned.popleft().close()
            closed += 1
        return closed

    def _expire(self, runner: Runner, seen: float) -> None:
        if not runner.lock.acquire(blocking=False):
            return  # busy right now, so not gone
        try:
            with self._lock:
                if self._seen.get(runner) != seen:
                    return  # it checked in meanwhile
                del self._seen[runner]
            runner.suspend()
        finally:
            runner.lock.release()


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
MEMO = 4  # rebuilt steps and attention heatmaps a run keeps for the pages reading it


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
            prefix_cache=cache, keep_full_traces=keep_full_traces, capture=CAPTURE)
        if len(session.prompt_ids) > config.max_prompt_tokens:
            session.close()
            raise engine.PromptTooLongError(f"the prompt is {len(session.prompt_ids)} tokens; this app allows "
                                            f"at most {config.max_prompt_tokens}")
        self.session = session
        self._rebuilt = Memo()  # step → its rebuilt trace
        self._attention = Memo()  # (layer, head) → (probs, scores)
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
            rebuilt = self._rebuilt.get(step)
            if rebuilt is None:
                rebuilt = self._rebuilt.put(step, self.session.rebuild(step - 1))
            return rebuilt

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

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.built = 0  # runs built so far
        self._lock = threading.Lock()  # guards the two dicts below
        self._runs: OrderedDict[RunKey, Run] = OrderedDict()
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
                        return run
                run = build()  # may raise (a prompt too long): nothing is stored
                with self._lock:
                    self._runs[key] = run
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
                    total -= sizes[key]

    @property
    def keys(self) -> list[RunKey]:
        """The keys of the runs kept, least recently used first."""
        with self._lock:
            return list(self._runs)


class Runner:
    """One browser session's view of a run: its settings, the run it reads and the prompts it published.

    runs: where runs are shared between pages (None: this page's runs are its own). classroom: the class's shared
    prefix cache, when the host turns it on; runs then depend on what other pages ran, so they are never shared.
    """

    def __init__(self, model: engine.Model, cache_tokens: int, keep_full_traces: int = Limits.full_traces,
                 classroom: ClassroomCache | None = None, runs: RunStore | None = None):
        self.model = model
        self.cache_tokens = cache_tokens  # the pool's size in positions, whatever the block size
        self.keep_full_traces = keep_full_traces
        self.classroom = classroom
        self.runs = runs if classroom is None else None
        self.lock = threading.RLock()  # this page's own state
        self.config: RunConfig | None = None
        self.run: Run | None = None
        self.history = PromptHistory()  # the prompts this browser session published
        self._saw_prefill = False  # this page reached step 1 of its run: leaving it publishes the prompt
        self._finalizer: weakref.finalize | None = None

    @property
    def session(self) -> engine.DecodeSession:
        return self.run.session

    @property
    def cache(self) -> engine.PrefixCache:
        return self.run.cache

    # -- configuration -------------------------------------------------------------------------

    def configure(self, config: RunConfig) -> None:
        """Read the run of `config`, starting or joining one when any setting changed; the prompt of the run
        left is published (this page's later runs start with it in their prefix cache)."""
        with self.lock:
            if config == self.config and self.run is not None:
                self._resume()
                return
            self.close()
            if self.classroom is not None:
                self.classroom.check_in(self)
            self.config = config
            self._open()

    def forget_published(self) -> None:
        """Leave the run and forget the prompts this page published: the next run's prefix cache starts empty. A
        lesson chapter starts so, so each visit to it (and every page following the class) reads the same run,
        computed once and kept in the store."""
        with self.lock:
            self.close()
            self.history = PromptHistory()

    def publish_alone(self, config: RunConfig) -> None:
        """Make `config`'s prompt, prefilled at its settings, the only prompt this page has published: the page's
        earlier prompts are forgotten, so the next run's cache and the policy comparison start from that prompt
        alone (the article's cases: their cached prompt, never the page's own earlier copy of the edit)."""
        with self.lock:
            self.forget_published()
            self.configure(config)  # no seeds now: a run any page opening a case shares
            self.advance_to(1)
            self.close()  # publishes it

    def _open(self) -> None:
        config = self.config
        if self.classroom is not None:
            cache = self.classroom.get(config.policy, config.block_size)
            self.run = Run(self.model, config, self.keep_full_traces, self.cache_tokens, cache=cache)
            # a shared pool must get the blocks back of a page that is gone
            self._finalizer = weakref.finalize(self, self.classroom.orphaned.append, self.run.session)
            self._finalizer.atexit = False
            return
        seeds = tuple(tuple(ids) for ids in self.history.prompts)
        build = lambda: Run(self.model, config, self.keep_full_traces, self.cache_tokens, seeds)  # noqa: E731
        self.run = build() if self.runs is None else self.runs.get((config, seeds), build)

    def _resume(self) -> None:
        """Renew the classroom lease; rebuild the run if it was closed while the student was away
        (same settings and seed, so the same tokens)."""
        if self.classroom is not None:
            self.classroom.check_in(self)
            if self.run is not None and self.run.closed:
                self._open()

    def suspend(self) -> None:
        """Close the run on the class's cache (its blocks go back), keeping the settings: the next use rebuilds it."""
        with self.lock:
            if self.run is not None:
                self._forget_finalizer()
                self.run.close()

    def _forget_finalizer(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None

    def close(self) -> None:
        """Leave the run: its prompt is published if this page saw its prefill; a run on the class's cache ends
        (its blocks go back), a shared one stays for the other pages reading it."""
        with self.lock:
            if self.run is None:
                return
            if self.classroom is not None:
                self._forget_finalizer()
                self.run.close()
            if self._saw_prefill:
                self.history.add(self.run.session.prompt_ids)
            self.run, self._saw_prefill = None, False

    # -- stepping ------------------------------------------------------------------------------

    @property
    def prompt_ids(self) -> list[int]:
        return self.session.prompt_ids

    @property
    def generated(self) -> int:
        return len(self.session.generated)

    @property
    def finished(self) -> bool:
        return self.session.finished

    def advance_to(self, step: int) -> int:
        """Run prefill/decode until `step` tokens exist (or the run ends); return the step reached."""
        with self.lock:
            self._resume()
            try:
                reached = self.run.advance_to(step)
            except engine.CacheFullError:
                if self.classroom is None or not self.classroom.reclaim(collect=True):
                    raise
                reached = self.run.advance_to(step)  # students who left gave blocks back; the failed call changed nothing
            self._saw_prefill = self._saw_prefill or reached >= 1
        if self.runs is not None:
            self.runs.trim()  # the run may have grown
        return reached

    def trace(self, step: int) -> StepTrace | None:
        """The trace that produced token `step` (1-based), with its tensors (rebuilt if it was slimmed)."""
        return self.run.trace(step)

    def texts(self, step: int) -> tuple[str, str]:
        """The prompt as the model read it, and the answer text after `step` tokens."""
        prompt = self.model.tokenizer.decode(self.session.prompt_ids)
        return prompt, self.session.text_after(min(step, len(self.session.generated)))

    def full_attention(self, step: int, layer: int, head: int):
        """Probabilities and scores (n, n) of one head of `layer` over the sequence step `step` attended."""
        n = len(self.session.prompt_ids) + max(0, step - 1)
        limit = step_limits(load_limits(), self.model.info).max_attention_tokens
        if n > limit:
            raise engine.InvalidSettingError(
                f"the full attention heatmap of {n} positions does not fit this server's step memory "
                f"(KVSCOPE_STEP_MEMORY_MB): at most {limit} positions")
        return self.run.full_attention(step, layer, head)

    def cached_kv(self, layer: int, length: int):
        """What this run's cache holds for `layer` among the first `length` positions: K, V and the position they
        start at (see `Run.cached_kv`)."""
        return self.run.cached_kv(layer, length)

    def split_demo(self, trace: StepTrace, layer: int, head: int) -> SplitKVTrace:
        """Split-KV replayed over what `trace` recorded for one head: its last row's scores and the cached V
        of that head's K/V group (no forward pass). For a run whose own attention is unsplit."""
        length = trace.scores.shape[-1]
        # Positions before `length` hold the same K/V at any later step. A sliding-window layer's scores are −inf
        # before the positions it still holds, so the demonstration starts where its cache does.
        _, v, start = self.cached_kv(layer, length)
        return split_demo(trace.scores[layer, head, -1, start:], v[:, head // self.model.info.gqa_group])

    # -- the window the views read: concept-named, plain data (never the session, pool or tokenizer) --

    @property
    def info(self) -> engine.ModelInfo:
        return self.model.info

    @property
    def stop_reason(self) -> str | None:
        return self.session.stop_reason

    def cells(self, step: int) -> list[TokenCell]:
        """The prompt's tokens and the first `step` generated ones, one cell each."""
        return token_cells(self.model.tokenizer, self.session.prompt_ids, self.session.generated[:step])

    def candidate_cells(self, step: int, candidate_ids: list[int]) -> list[TokenCell]:
        """The candidates for token `step` (1-based), each as the cell it would become after the tokens before
        it: a candidate finishing a character those left unfinished belongs to that character's group."""
        context = (self.session.prompt_ids + self.session.generated)[:len(self.session.prompt_ids) + step - 1]
        return candidate_cells(self.model.tokenizer, context, candidate_ids)

    def prompt_cells(self, ids: list[int]) -> list[TokenCell]:
        """Cells for another prompt's ids (e.g. the cached prompt a new one is aligned with)."""
        return token_cells(self.model.tokenizer, ids, [])

    def prompt_tail_text(self, keep: int) -> str:
        """The text of the prompt's last `keep` tokens: what a truncated prompt would still say."""
        return self.model.tokenizer.decode(self.session.prompt_ids[len(self.session.prompt_ids) - keep:])

    def prompt_segments(self) -> list[PromptSegment]:
        """The prompt as the model reads it, split into the chat template's text and the user's."""
        return prompt_segments(self.model, self.config.prompt, self.config.chat, self.config.think)

    @property
    def can_chat(self) -> bool:
        """Whether the model has a chat template to wrap the prompt in (a base model has none)."""
        return has_chat_template(self.model.tokenizer)

    @property
    def can_think(self) -> bool:
        """Whether the model's chat template has a thinking switch (Qwen3's `enable_thinking`)."""
        return template_can_think(self.model.tokenizer)

    def step_traces(self, step: int) -> list[StepTrace]:
        """The traces of the first `step` steps (older ones slimmed: ids, timings, candidates)."""
        return self.session.traces[:step]

    def busy_pool(self, step: int) -> BusyPoolPicture:
        """This run's first `step` steps replayed in a pool other requests used first: where its blocks land."""
        return self.run.busy_pool(step)

    def decode_timing(self, prompt: int, context: int) -> DecodeTiming:
        """Steady timings of this model's prefill of `prompt` tokens and decode steps at `context` positions,
        measured now beside the peak read bandwidth (a scratch pool: the run is untouched)."""
        return measure_decode(self.model, prompt, context)

    def pool_state(self) -> PoolState:
        """The KV pool this run's blocks come from (read under the pool's lock: it may be shared)."""
        pool = self.cache.pool
        return PoolState(block_size=pool.block_size, blocks=pool.num_blocks,
                         cached_free=self.cache.cached_free_blocks())

    def prefix_hit(self) -> PrefixHit | None:
        """How this run's prefill used the prefix cache (None before the prefill)."""
        return self.session.traces[0].prefix if self.session.traces else None

    def evictions(self) -> int:
        """Blocks the prefix cache has evicted so far (the last 1,000 are remembered)."""
        return len(self.cache.evictions)

    def policy_reuse(self) -> dict[str, PolicyReuse]:
        return self.history.predicted_reuse(self.session.prompt_ids, self.config.block_size)

    def closest_cached(self) -> tuple[list[int], int] | None:
        """The published prompt sharing the longest prefix with this one, and where they first differ."""
        return self.history.closest(self.session.prompt_ids)


@dataclass(frozen=True)
class PoolState:
    block_size: int
    blocks: int
    cached_free: int  # free blocks a prefix-cache lookup can still hit


class Memo:
    """At most MEMO values, the least recently used dropped first; safe to read while other pages add to it
    (the store sizes runs without their locks)."""

    def __init__(self):
        self._values: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key):
        with self._lock:
            if key in self._values:
                self._values.move_to_end(key)
            return self._values.get(key)

    def put(self, key, value):
        with self._lock:
            self._values[key] = value
            self._values.move_to_end(key)
            while len(self._values) > MEMO:
                self._values.popitem(last=False)
        return value

    def values(self) -> list:
        with self._lock:
            return list(self._values.values())


def _grow(matrix, row, future: float):
    """Append one query row (length n+1) to an n × n causal matrix; earlier rows get `future` for the
    new key they cannot see (0 for probabilities, −inf for scores)."""
    n = matrix.shape[0]
    grown = matrix.new_full((n + 1, n + 1), future)
    grown[:n, :n] = matrix
    grown[n] = row
    return grown

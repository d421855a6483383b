"""One browser session's run: its decode session, its prefix cache and the prompts it published.

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
from engine.prefix_cache import PolicyReuse, PromptHistory
from engine.prompt import PromptSegment, prompt_segments, template_can_think
from engine.split_kv import split_demo
from engine.tokens import TokenCell, candidate_cells, token_cells
from engine.trace import PrefixHit, SplitKVTrace, StepTrace
from ui.settings import Limits, load_limits, step_limits

HISTORY = 8  # published prompts kept for the policy comparison
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


class Runner:
    def __init__(self, model: engine.Model, cache_tokens: int, keep_full_traces: int = 8,
                 classroom: ClassroomCache | None = None):
        self.model = model
        self.cache_tokens = cache_tokens  # the pool's size in positions, whatever the block size
        self.keep_full_traces = keep_full_traces
        self.classroom = classroom
        self.lock = threading.RLock()  # this run's own state; a shared pool has its own lock for bookkeeping
        self.config: RunConfig | None = None
        self.session: engine.DecodeSession | None = None
        self.cache: engine.PrefixCache | None = None
        self.history = PromptHistory(HISTORY)  # the prompts this browser session published
        self._rebuilt: tuple[int, StepTrace] | None = None  # the last slimmed step rebuilt, for reruns
        self._attention: tuple[tuple, tuple] | None = None
        self._finalizer: weakref.finalize | None = None

    # -- configuration -------------------------------------------------------------------------

    def configure(self, config: RunConfig) -> None:
        """Start a new run when any setting changed; the old prompt is published to the prefix cache."""
        with self.lock:
            if config == self.config and self.session is not None:
                self._resume()
                return
            self.close()
            if self.classroom is not None:
                self.classroom.check_in(self)
            self._open(config)

    def _open(self, config: RunConfig) -> None:
        """A new decode session for `config`, on the class's prefix cache or this runner's own."""
        if self.classroom is not None:
            self.cache = self.classroom.get(config.policy, config.block_size)
        elif self.cache is None or (self.cache.policy, self.cache.block_size) != (config.policy, config.block_size):
            self.cache = engine.PrefixCache(self.model, policy=config.policy, block_size=config.block_size,
                                            capacity_blocks=self._pool_blocks(config))
        self.config = config
        session = engine.DecodeSession(
            self.model, config.prompt, chat=config.chat, think=config.think, sampling=config.sampling, block_size=config.block_size,
            max_new_tokens=config.max_new_tokens, kv_splits=config.kv_splits, prefix_cache=self.cache,
            keep_full_traces=self.keep_full_traces, capture=CAPTURE,
        )
        if len(session.prompt_ids) > config.max_prompt_tokens:
            session.close()
            raise engine.PromptTooLongError(f"the prompt is {len(session.prompt_ids)} tokens; this app allows "
                                            f"at most {config.max_prompt_tokens}")
        self.session = session
        if self.classroom is not None:  # a private pool goes with this runner; a shared one must get its blocks back
            self._finalizer = weakref.finalize(self, self.classroom.orphaned.append, session)
            self._finalizer.atexit = False
        self._rebuilt = None
        self._attention = None

    def _resume(self) -> None:
        """Renew the classroom lease; rebuild the session if it was closed while the student was away
        (same settings and seed, so the same tokens)."""
        if self.classroom is not None:
            self.classroom.check_in(self)
        if self.session is not None and self.session.closed:
            self._open(self.config)

    def suspend(self) -> None:
        """Close the decode session (its blocks go back), keeping the settings: the next use rebuilds it."""
        with self.lock:
            if self.session is not None:
                self._forget_finalizer()
                self.session.close()

    def _forget_finalizer(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None

    def _pool_blocks(self, config: RunConfig) -> int:
        """Room for the host's cache size, and always for one longest run."""
        tokens = max(self.cache_tokens, config.max_prompt_tokens + config.max_new_tokens)
        return -(-tokens // config.block_size) + 2

    def close(self) -> None:
        """End the run: its prompt is published (if prefilled) and its blocks go back."""
        with self.lock:
            if self.session is None:
                return
            self._forget_finalizer()
            published = bool(self.session.traces)
            self.session.close()
            if published:
                self.history.add(self.session.prompt_ids)
            self.session = None

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
                return self._advance(step)
            except engine.CacheFullError:
                if self.classroom is None or not self.classroom.reclaim(collect=True):
                    raise
                return self._advance(step)  # students who left gave blocks back; the failed call changed nothing

    def _advance(self, step: int) -> int:
        session = self.session
        if step >= 1 and not session.traces:
            session.prefill()
        while len(session.generated) < step and not session.finished:
            session.step()
        return min(step, len(session.generated))

    def trace(self, step: int) -> StepTrace | None:
        """The trace that produced token `step` (1-based), with its tensors: if it was slimmed, rebuilt
        by one forward pass over the K/V the run's cache holds."""
        if step < 1 or step > len(self.session.traces):
            return None
        trace = self.session.traces[step - 1]
        if not trace.is_slim:
            return trace
        if self._rebuilt is None or self._rebuilt[0] != step:  # no lock: a rebuild only reads this run's blocks
            self._rebuilt = (step, self.session.rebuild(step - 1))
        return self._rebuilt[1]

    def texts(self, step: int) -> tuple[str, str]:
        """The prompt as the model read it, and the answer text after `step` tokens."""
        prompt = self.model.tokenizer.decode(self.session.prompt_ids)
        return prompt, self.session.text_after(min(step, len(self.session.generated)))

    def full_attention(self, step: int, layer: int, head: int):
        """Probabilities and scores (n, n) of one head of `layer` over the sequence step `step` attended.

        Computed once by a fresh prefill, then grown row by row from the decode steps' own recorded
        rows, so stepping forward costs one row, not a prefill. Only the shown head is kept.
        """
        n = len(self.session.prompt_ids) + max(0, step - 1)
        limit = step_limits(load_limits(), self.model.info).max_attention_tokens
        if n > limit:
            raise engine.InvalidSettingError(
                f"the full attention heatmap of {n} positions does not fit this server's step memory "
                f"(KVSCOPE_STEP_MEMORY_MB): at most {limit} positions")
        key = (self.config, layer, head)
        if self._attention is not None and self._attention[0] == key:
            probs, scores = self._attention[1]
            while probs.shape[0] < n and (row := self._decode_row(probs.shape[0] + 1, layer, head)) is not None:
                probs, scores = _grow(probs, row[0], 0.0), _grow(scores, row[1], float("-inf"))
            self._attention = (key, (probs, scores))
            if probs.shape[0] >= n:
                return probs[:n, :n], scores[:n, :n]
        ids = (self.session.prompt_ids + self.session.generated)[:n]
        probs, scores = self.model.full_attention(ids, layer, self.config.block_size)
        self._attention = (key, (probs[head].clone(), scores[head].clone()))
        return self._attention[1]

    def _decode_row(self, length: int, layer: int, head: int):
        """The row a decode step recorded when the sequence reached `length` positions, if still kept."""
        index = length - len(self.session.prompt_ids)  # traces[index] is that decode step
        if not 1 <= index < len(self.session.traces) or self.session.traces[index].is_slim:
            return None
        trace = self.session.traces[index]
        return trace.attention[layer, head, 0], trace.scores[layer, head, 0]

    def cached_kv(self, layer: int, length: int):
        """The K and V this run's cache holds for `layer`: (length, kv_heads, head_dim) each."""
        with self.lock:
            k, v = self.session.pool.read(layer, self.session.table.device_blocks(), length)
        return k, v

    def split_demo(self, trace: StepTrace, layer: int, head: int) -> SplitKVTrace:
        """Split-KV replayed over what `trace` recorded for one head: its last row's scores and the cached V
        of that head's K/V group (no forward pass). For a run whose own attention is unsplit."""
        length = trace.scores.shape[-1]
        _, v = self.cached_kv(layer, length)  # positions before `length` hold the same K/V at any later step
        return split_demo(trace.scores[layer, head, -1], v[:, head // self.model.info.gqa_group])

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
    def can_think(self) -> bool:
        """Whether the model's chat template has a thinking switch (Qwen3's `enable_thinking`)."""
        return template_can_think(self.model.tokenizer)

    def step_traces(self, step: int) -> list[StepTrace]:
        """The traces of the first `step` steps (older ones slimmed: ids, timings, candidates)."""
        return self.session.traces[:step]

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


def _grow(matrix, row, future: float):
    """Append one query row (length n+1) to an n × n causal matrix; earlier rows get `future` for the
    new key they cannot see (0 for probabilities, −inf for scores)."""
    n = matrix.shape[0]
    grown = matrix.new_full((n + 1, n + 1), future)
    grown[:n, :n] = matrix
    grown[n] = row
    return grown

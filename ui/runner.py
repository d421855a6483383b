"""One browser session's run: its decode session, its prefix cache and the prompts it published.

Plain Python (no Streamlit), so the app's step logic is tested like the engine. `step` counts
generated tokens: 0 is the prompt alone, 1 is after the prefill (which yields the first token).
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

import engine
from engine.prefix_cache import closest_prompt, predicted_reuse
from engine.trace import StepTrace

HISTORY = 8  # published prompts kept for the policy comparison
CAPTURE = engine.Capture(attention_budget=1_000_000)  # a prefill keeps at most 4 MB each of probs and scores


class ClassroomCache:
    """One prefix cache per (policy, block size) for the whole class, when the host turns it on.

    Sessions then reuse each other's prompt K/V. Every use of its pool goes through `lock`.
    """

    def __init__(self, model: engine.Model, tokens: int):
        self.model = model
        self.tokens = tokens
        self.lock = threading.RLock()
        self._caches: dict[tuple[str, int], engine.PrefixCache] = {}

    def get(self, policy: str, block_size: int) -> engine.PrefixCache:
        with self.lock:
            key = (policy, block_size)
            if key not in self._caches:
                self._caches[key] = engine.PrefixCache(self.model, policy=policy, block_size=block_size,
                                                       capacity_blocks=-(-self.tokens // block_size))
            return self._caches[key]


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


class Runner:
    def __init__(self, model: engine.Model, cache_tokens: int, keep_full_traces: int = 8,
                 classroom: ClassroomCache | None = None):
        self.model = model
        self.cache_tokens = cache_tokens  # the pool's size in positions, whatever the block size
        self.keep_full_traces = keep_full_traces
        self.classroom = classroom
        self.lock = classroom.lock if classroom is not None else contextlib.nullcontext()
        self.config: RunConfig | None = None
        self.session: engine.DecodeSession | None = None
        self.cache: engine.PrefixCache | None = None
        self.history: list[list[int]] = []  # prompts published in this browser session, oldest first
        self._replay: tuple[int, StepTrace] | None = None
        self._attention: tuple[tuple, tuple] | None = None

    # -- configuration -------------------------------------------------------------------------

    def configure(self, config: RunConfig) -> None:
        """Start a new run when any setting changed; the old prompt is published to the prefix cache."""
        if config == self.config and self.session is not None:
            return
        with self.lock:
            self.close()
            if self.classroom is not None:
                self.cache = self.classroom.get(config.policy, config.block_size)
            elif self.cache is None or (self.cache.policy, self.cache.block_size) != (config.policy, config.block_size):
                self.cache = engine.PrefixCache(self.model, policy=config.policy, block_size=config.block_size,
                                                capacity_blocks=self._pool_blocks(config))
            self.config = config
            session = engine.DecodeSession(
                self.model, config.prompt, chat=config.chat, sampling=config.sampling, block_size=config.block_size,
                max_new_tokens=config.max_new_tokens, kv_splits=config.kv_splits, prefix_cache=self.cache,
                keep_full_traces=self.keep_full_traces, capture=CAPTURE,
            )
            if len(session.prompt_ids) > config.max_prompt_tokens:
                session.close()
                raise engine.PromptTooLongError(f"the prompt is {len(session.prompt_ids)} tokens; this app allows "
                                                f"at most {config.max_prompt_tokens}")
            self.session = session
            self._replay = None
            self._attention = None

    def _pool_blocks(self, config: RunConfig) -> int:
        """Room for the host's cache size, and always for one longest run."""
        tokens = max(self.cache_tokens, config.max_prompt_tokens + config.max_new_tokens)
        return -(-tokens // config.block_size) + 2

    def close(self) -> None:
        if self.session is None:
            return
        with self.lock:
            published = bool(self.session.traces)
            self.session.close()
            if published:
                self.history = (self.history + [list(self.session.prompt_ids)])[-HISTORY:]
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
        session = self.session
        with self.lock:
            if step >= 1 and not session.traces:
                session.prefill()
            while len(session.generated) < step and not session.finished:
                session.step()
        return min(step, len(session.generated))

    def trace(self, step: int) -> StepTrace | None:
        """The trace that produced token `step` (1-based), with its tensors: replayed if it was slimmed."""
        if step < 1 or step > len(self.session.traces):
            return None
        trace = self.session.traces[step - 1]
        if not trace.is_slim:
            return trace
        if self._replay is None or self._replay[0] != step:
            self._replay = (step, self._replay_trace(step))
        return self._replay[1]

    def _replay_trace(self, step: int) -> StepTrace:
        """Same settings and seed, no prefix cache: the tokens and numbers are those of the original run."""
        c = self.config
        shadow = engine.DecodeSession(self.model, self.session.prompt_ids, sampling=c.sampling,
                                      block_size=c.block_size, max_new_tokens=c.max_new_tokens,
                                      kv_splits=c.kv_splits, keep_full_traces=1, capture=CAPTURE)
        trace = shadow.prefill()
        while len(shadow.generated) < step:
            trace = shadow.step()
        shadow.close()
        return trace

    def texts(self, step: int) -> tuple[str, str]:
        """The prompt as the model read it, and the answer text after `step` tokens."""
        prompt = self.model.tokenizer.decode(self.session.prompt_ids)
        return prompt, "".join(t.text for t in self.session.traces[:step])

    def full_attention(self, step: int, layer: int, head: int):
        """Probabilities and scores (n, n) of one head of `layer` over the sequence step `step` attended.

        Computed once by a fresh prefill, then grown row by row from the decode steps' own recorded
        rows, so stepping forward costs one row, not a prefill. Only the shown head is kept.
        """
        n = len(self.session.prompt_ids) + max(0, step - 1)
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

    def cached_free_blocks(self) -> int:
        """Free blocks the prefix cache still holds (read under the lock: a classroom pool is shared)."""
        with self.lock:
            return sum(1 for block in self.session.pool.free if self.cache.holds(block))

    def policy_reuse(self) -> dict[str, int]:
        return predicted_reuse(self.history, self.session.prompt_ids, self.config.block_size)

    def closest_cached(self) -> list[int] | None:
        closest = closest_prompt(self.history, self.session.prompt_ids)
        return None if closest is None else closest[0]


def _grow(matrix, row, future: float):
    """Append one query row (length n+1) to an n × n causal matrix; earlier rows get `future` for the
    new key they cannot see (0 for probabilities, −inf for scores)."""
    n = matrix.shape[0]
    grown = matrix.new_full((n + 1, n + 1), future)
    grown[:n, :n] = matrix
    grown[n] = row
    return grown

"""One browser session's run: its decode session, its prefix cache and the prompts it published.

Plain Python (no Streamlit), so the app's step logic is tested like the engine. `step` counts
generated tokens: 0 is the prompt alone, 1 is after the prefill (which yields the first token).
"""

from __future__ import annotations

from dataclasses import dataclass

import engine
from engine.prefix_cache import common_prefix_length, predicted_reuse
from engine.trace import StepTrace

HISTORY = 8  # published prompts kept for the policy comparison


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
    def __init__(self, model: engine.Model, cache_tokens: int, keep_full_traces: int = 32):
        self.model = model
        self.cache_tokens = cache_tokens  # the pool's size in positions, whatever the block size
        self.keep_full_traces = keep_full_traces
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
        self.close()
        if self.cache is None or (self.cache.policy, self.cache.block_size) != (config.policy, config.block_size):
            self.cache = engine.PrefixCache(self.model, policy=config.policy, block_size=config.block_size,
                                            capacity_blocks=self._pool_blocks(config))
        self.config = config
        session = engine.DecodeSession(
            self.model, config.prompt, chat=config.chat, sampling=config.sampling, block_size=config.block_size,
            max_new_tokens=config.max_new_tokens, kv_splits=config.kv_splits, prefix_cache=self.cache,
            keep_full_traces=self.keep_full_traces,
            capture=engine.Capture(attention_budget=1_000_000),
        )
        if len(session.prompt_ids) > config.max_prompt_tokens:
            session.close()
            raise engine.PromptTooLongError(
                f"the prompt is {len(session.prompt_ids)} tokens; this app allows at most {config.max_prompt_tokens}")
        self.session = session
        self._replay = None
        self._attention = None

    def _pool_blocks(self, config: RunConfig) -> int:
        """Room for the host's cache size, and always for one longest run."""
        tokens = max(self.cache_tokens, config.max_prompt_tokens + config.max_new_tokens)
        return -(-tokens // config.block_size) + 2

    def close(self) -> None:
        if self.session is not None:
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
                                      kv_splits=c.kv_splits, keep_full_traces=1,
                                      capture=engine.Capture(attention_budget=1_000_000))
        trace = shadow.prefill()
        while len(shadow.generated) < step:
            trace = shadow.step()
        shadow.close()
        return trace

    def texts(self, step: int) -> tuple[str, str]:
        """The prompt as the model read it, and the answer text after `step` tokens."""
        prompt = self.model.tokenizer.decode(self.session.prompt_ids)
        return prompt, "".join(t.text for t in self.session.traces[:step])

    def full_attention(self, step: int, layer: int):
        """Probabilities and scores (q_heads, n, n) of `layer` over the sequence that step `step` attended."""
        n = len(self.session.prompt_ids) + max(0, step - 1)
        key = (self.config, n, layer)
        if self._attention is None or self._attention[0] != key:
            ids = (self.session.prompt_ids + self.session.generated)[:n]
            self._attention = (key, self.model.full_attention(ids, layer, self.config.block_size))
        return self._attention[1]

    def cached_kv(self, layer: int, length: int):
        """The K and V this run's cache holds for `layer`: (length, kv_heads, head_dim) each."""
        return self.session.pool.read(layer, self.session.table.device_blocks(), length)

    def policy_reuse(self) -> dict[str, int]:
        return predicted_reuse(self.history, self.session.prompt_ids, self.config.block_size)

    def closest_cached(self) -> list[int] | None:
        best = None
        for earlier in self.history:
            shared = common_prefix_length(earlier, self.session.prompt_ids)
            if best is None or shared >= best[1]:
                best = (earlier, shared)
        return None if best is None else best[0]

"""Each browser session's `Runner`: its settings, the run it reads (`ui.runs.run`), the prompts it published, and
the concept-named methods the views read the engine through (those computed beside the run, in the store:
`ui.runs.experiments`).

Plain Python (no Streamlit), so the app's step logic is tested like the engine. `step` counts
generated tokens: 0 is the prompt alone, 1 is after the prefill (which yields the first token).
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable

import engine
from engine.busy_pool import BusyPoolPicture
from engine.prefix_cache import PolicyReuse, PoolState, PromptHistory
from engine.prompt import PromptSegment, has_chat_template, prompt_segments, template_can_think
from engine.split_kv import split_demo
from engine.timing import DecodeTiming, measure_decode
from engine.tokens import TokenCell, token_cells
from engine.trace import PrefixHit, SplitKVTrace, StepTrace
from ui.host import memory
from ui.host.limits import Limits, step_limits
from ui.runs.experiments import Experiments
from ui.runs.run import Lease, OwnRuns, Run, RunConfig, RunSource
from ui.runs.store import RunStore

# A link opened at a late step computes its steps in one go (a class's heavy links: over a hundred), and the many
# traces it slims on the way leave holes in the heap: that page hands them back at once (ui.host.memory's trim, a few
# hundred ms with the arenas locked, against the seconds of its steps) rather than at the next minute's sweep, so
# a class opening such links does not add its garbage to its peak. One press, or a short walk, never trims.
CATCH_UP_STEPS = 32


class Runner(Experiments):
    """One browser session's view of a run: its settings, the run it reads and the prompts it published.

    runs: where its runs come from, each held by a lease (`ui.runs.run.Lease`): the store that shares them between
    pages (`ui.runs.store`), the class's shared prefix cache (`ui.runs.classroom`), or None: this page's own.
    store: where what pages share beside their run lives, the eviction view's labs and the two-contexts K/V (the
    server's run store; by default one of this page's own).
    """

    def __init__(
        self,
        model: engine.Model,
        cache_tokens: int,
        keep_full_traces: int = Limits.full_traces,
        runs: RunSource | None = None,
        limits: Limits = Limits(),
        store: RunStore | None = None,
    ):
        self.model = model
        self.cache_tokens = cache_tokens  # the pool's size in positions, whatever the block size
        self.keep_full_traces = keep_full_traces
        self.max_attention_tokens = step_limits(limits, model.info).max_attention_tokens  # the host's step memory
        self.limits = limits
        self.runs = OwnRuns() if runs is None else runs
        self.store = RunStore(limits.shared_runs_mb * 10**6) if store is None else store
        self.lock = threading.RLock()  # this page's own state
        self.config: RunConfig | None = None
        self.lease: Lease | None = None
        self.history = PromptHistory()  # the prompts this browser session published
        self._saw_prefill = False  # this page reached step 1 of its run: leaving it publishes the prompt

    @property
    def run(self) -> Run | None:
        return None if self.lease is None else self.lease.run

    @property
    def generation(self) -> engine.Generation:
        return self.run.generation

    @property
    def cache(self) -> engine.PrefixCache:
        return self.run.cache

    # -- configuration -------------------------------------------------------------------------

    def configure(self, config: RunConfig) -> None:
        """Read the run of `config`, starting or joining one when any setting changed; the prompt of the run
        left is published (this page's later runs start with it in their prefix cache)."""
        with self.lock:
            if config == self.config and self.lease is not None:
                self.lease.renew()
                return
            self.close()
            self.config = config
            seeds = tuple(tuple(ids) for ids in self.history.prompts)
            build = functools.partial(Run, self.model, config, self.keep_full_traces, self.cache_tokens)
            self.lease = self.runs.lease(config, seeds, build)

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

    def close(self) -> None:
        """Leave the run (its lease says what that means to its source); its prompt is published if this page saw
        its prefill."""
        with self.lock:
            if self.lease is None:
                return
            self.lease.release()
            if self._saw_prefill:
                self.history.add(self.lease.run.generation.prompt_ids)
            self.lease, self._saw_prefill = None, False

    # -- stepping ------------------------------------------------------------------------------

    @property
    def prompt_ids(self) -> list[int]:
        return self.generation.prompt_ids

    @property
    def generated(self) -> int:
        return len(self.generation.generated)

    @property
    def finished(self) -> bool:
        return self.generation.finished

    def advance_to(self, step: int, progress: Callable[[int], None] | None = None) -> int:
        """Run prefill/decode until `step` tokens exist (or the run ends); return the step reached. `progress(tokens)`
        is told after each pass but the last (`Run.advance_to`)."""
        with self.lock:
            lease = self.lease
            with lease.held() as run:
                before = len(run.generation.generated)
                try:
                    reached = run.advance_to(step, progress)
                except engine.CacheFullError:
                    if not lease.make_room():
                        raise
                    # Pages that left gave blocks back; the failed call changed nothing.
                    reached = run.advance_to(step, progress)
            self._saw_prefill = self._saw_prefill or reached >= 1
        lease.grown()  # outside the page's lock: the store sizes its runs
        if reached - before >= CATCH_UP_STEPS:
            memory.release_free_memory()
        return reached

    def trace(self, step: int) -> StepTrace | None:
        """The trace that produced token `step` (1-based), with its tensors (rebuilt if it was slimmed)."""
        return self.run.trace(step)

    def texts(self, step: int) -> tuple[str, str]:
        """The prompt as the model read it, and the answer text after `step` tokens."""
        return self.run.prompt_text, self.generation.text_after(min(step, len(self.generation.generated)))

    def short_of_memory(self) -> bool:
        """Whether the server is too close to the host's memory for this page's costliest figures (ui.host.memory)."""
        return memory.short_of_memory(self.limits.memory_mb, self.limits.step_memory_mb)

    def heatmap_span(self, step: int) -> tuple[int, int]:
        """The positions step `step`'s full heatmap spans, and the most this server's step memory allows."""
        return len(self.generation.prompt_ids) + max(0, step - 1), self.max_attention_tokens

    def full_attention(self, step: int, layer: int, head: int):
        """Probabilities and scores (n, n) of one head of `layer` over the sequence step `step` attended."""
        n, limit = self.heatmap_span(step)
        if n > limit:
            raise engine.InvalidSettingError(
                f"the full attention heatmap of {n} positions does not fit this server's step memory "
                f"(KVSCOPE_STEP_MEMORY_MB): at most {limit} positions"
            )
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

    # -- the window the views read: concept-named, plain data (never the generation, pool or tokenizer) --

    @property
    def info(self) -> engine.ModelInfo:
        return self.model.info

    @property
    def stop_reason(self) -> str | None:
        return self.generation.stop_reason

    @property
    def chat(self) -> bool:
        """Whether the run wraps the prompt in the chat template."""
        return self.config.chat

    @property
    def max_prompt_tokens(self) -> int:
        """The most prompt tokens the host lets a run read."""
        return self.config.max_prompt_tokens

    @property
    def step_memory_mb(self) -> int:
        """The host's memory budget for one step's arrays (what caps a figure or a lab)."""
        return self.limits.step_memory_mb

    @property
    def embed_scale(self) -> float | None:
        """What the embedding row is multiplied by before the first layer (Gemma's √hidden), None where it is not."""
        return self.model.weights.embed_scale

    def attention_scale(self, layer: int) -> float:
        """The factor on layer `layer`'s query·key scores before the softmax."""
        return self.model.attention_scales[layer]

    def run_key(self) -> weakref.ref:
        """The run shown, weakly: a memo key that tells runs apart and never keeps one alive."""
        return weakref.ref(self.run)

    def cells(self, step: int) -> list[TokenCell]:
        """The prompt's tokens and the first `step` generated ones, one cell each (shared: only read)."""
        return self.run.cells(step)

    def candidate_cells(self, step: int, candidate_ids: list[int]) -> list[TokenCell]:
        """The candidates for token `step` (1-based), each as the cell it would become after the tokens before
        it: a candidate finishing a character those left unfinished belongs to that character's group."""
        return self.run.candidate_cells(step, candidate_ids)

    def prompt_cells(self, ids: list[int]) -> list[TokenCell]:
        """Cells for another prompt's ids (e.g. the cached prompt a new one is aligned with)."""
        return token_cells(self.model.tokenizer, ids, [])

    def prompt_tail_text(self, keep: int) -> str:
        """The text of the prompt's last `keep` tokens: what a truncated prompt would still say."""
        return self.model.tokenizer.decode(self.generation.prompt_ids[len(self.generation.prompt_ids) - keep :])

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
        return self.generation.traces[:step]

    def busy_pool(self, step: int) -> BusyPoolPicture:
        """This run's first `step` steps replayed in a pool other requests used first: where its blocks land."""
        return self.run.busy_pool(step)

    def decode_timing(self, prompt: int, context: int, bandwidth_again: bool = False) -> DecodeTiming:
        """Steady timings of this model's prefill of `prompt` tokens and decode steps at `context` positions,
        measured now beside the server's peak read bandwidth (measured anew with `bandwidth_again`; a scratch
        pool: the run is untouched)."""
        return measure_decode(self.model, prompt, context, bandwidth_again=bandwidth_again)

    def pool_state(self) -> PoolState:
        """The KV pool this run's blocks come from (read under the pool's lock: it may be shared)."""
        pool = self.cache.pool
        return PoolState(
            block_size=pool.block_size, blocks=pool.num_blocks, cached_free=self.cache.cached_free_blocks()
        )

    def prefix_hit(self) -> PrefixHit | None:
        """How this run's prefill used the prefix cache (None before the prefill)."""
        return self.generation.traces[0].prefix if self.generation.traces else None

    def blocks_reclaimed(self) -> int:
        """Cached blocks the prefix cache has handed out again for new K/V so far (the last 1,000 are remembered)."""
        return len(self.cache.reclaims)

    def policy_reuse(self) -> dict[str, PolicyReuse]:
        return self.history.predicted_reuse(self.generation.prompt_ids, self.config.block_size)

    def closest_cached(self) -> tuple[list[int], int] | None:
        """The published prompt sharing the longest prefix with this one, and where they first differ."""
        return self.history.closest(self.generation.prompt_ids)

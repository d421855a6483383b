"""A generation: one prompt, prefilled once, then decoded one token per step, with a trace per step.

    generation = Generation(model, "What is a KV cache?", chat=True, sampling=Sampling(temperature=0.7, seed=1))
    first = generation.prefill()          # all prompt tokens in one pass → the first answer token
    while not generation.finished:
        trace = generation.step()         # the last token's embedding row → every layer → the next token
    generation.close()                    # the generation's KV blocks go back to the pool

The generation owns the run's state (ids, traces, text, block table) and the order of calls; it leans on
`settings` (argument checks), `prompt` (chat template), `sampler` (the draw and its candidates),
`detokenizer` (the answer text) and `stopwatch` (step timings).

The generation's KV cache is private to it and freed at the end. With a `PrefixCache`, its blocks come
from the cache's pool: the prefill reuses what the cache holds, and on close the prompt's blocks
are published there for later prompts.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

from engine.checks import is_integer
from engine.detokenizer import IncrementalDetokenizer
from engine.errors import GenerationStateError
from engine.kv_cache import DEFAULT_BLOCK_SIZE, BlockPool, BlockTable
from engine.model import Model
from engine.prefix_cache import PrefixCache
from engine.prompt import tokenize_prompt
from engine.recorder import ForwardRecord
from engine.replay import Replay, reused_window_kv
from engine.sampler import Sampling, candidates, sample
from engine.settings import check_prefix_cache, check_prompt_fits, check_settings
from engine.stopping import stop_reason
from engine.stopwatch import Stopwatch
from engine.trace import Capture, StepTrace


class Generation:
    """Step-by-step generation for one prompt.

    prompt: text, or a list of token ids. With `chat=True` a text prompt is wrapped as a user message
    by the tokenizer's chat template (with the generation prompt); `think` turns on the thinking of a
    template that has the switch (Qwen3: off by default, its answer then starts after an empty think block).
    keep_full_traces: how many of the latest steps keep their heavy tensors (attention, logits,
    residuals); older traces are slimmed, so a long run's memory stays bounded. full_trace_bytes: fewer of them
    when theirs would pass these bytes (the newest always keeps its own): a step in many KV splits keeps a
    split record several megabytes large.
    kv_splits: attention reads the cached K/V in this many splits and merges them (FlashDecoding).
    prefix_cache: reuse (and later publish) prompt K/V; block_size then defaults to the cache's.
    """

    def __init__(
        self,
        model: Model,
        prompt: str | Sequence[int],
        *,
        chat: bool = False,
        think: bool = False,
        sampling: Sampling | None = None,
        block_size: int | None = None,
        max_new_tokens: int = 256,
        capture: Capture | None = None,
        keep_full_traces: int = 32,
        full_trace_bytes: int | None = None,
        kv_splits: int = 1,
        prefix_cache: PrefixCache | None = None,
    ):
        if block_size is None:
            block_size = prefix_cache.block_size if prefix_cache is not None else DEFAULT_BLOCK_SIZE
        check_settings(block_size, max_new_tokens, keep_full_traces, kv_splits)
        if prefix_cache is not None:
            check_prefix_cache(prefix_cache, model, block_size)
        self.model = model
        self.sampling = sampling or Sampling()
        self.capture = capture or Capture()
        self.keep_full_traces = keep_full_traces
        self.full_trace_bytes = full_trace_bytes
        self.max_new_tokens = max_new_tokens
        self.kv_splits = kv_splits
        self.prefix_cache = prefix_cache
        self.prompt_ids = tokenize_prompt(model, prompt, chat, think)
        check_prompt_fits(self.prompt_ids, model)
        if prefix_cache is not None:
            self.pool: BlockPool = prefix_cache.pool
        else:
            capacity = min(len(self.prompt_ids) + max_new_tokens, model.info.context_limit)
            self.pool = model.new_pool(math.ceil(capacity / block_size), block_size)
        self.table = BlockTable(self.pool)
        self.generated: list[int] = []
        self.traces: list[StepTrace] = []
        self.detokenizer = IncrementalDetokenizer(model.tokenizer, self.prompt_ids)
        self.stop_reason: str | None = None
        self.closed = False
        self._reused_window_kv: list = []  # a reused prefix's local-layer K/V, for a replay (engine.replay)
        self._replay: Replay | None = None  # the passes recomputed for steps whose window was handed back

    # -- state -------------------------------------------------------------------------------

    @property
    def ids(self) -> list[int]:
        """Prompt and answer: one sequence."""
        return self.prompt_ids + self.generated

    @property
    def finished(self) -> bool:
        return self.stop_reason is not None

    @property
    def text(self) -> str:
        """The answer text shown so far: every step's piece joined."""
        return self.text_after(len(self.generated))

    def text_after(self, count: int) -> str:
        """The answer text after its first `count` tokens (0 … len(generated)): their pieces joined.

        A piece holds back the bytes of an unfinished character until a later token completes it (see
        `engine.detokenizer`), so this is never a broken character."""
        if not is_integer(count) or not 0 <= count <= len(self.generated):
            raise GenerationStateError(
                f"text_after takes a token count from 0 to {len(self.generated)} (the answer's "
                f"length so far), got {count!r}"
            )
        return "".join(trace.text for trace in self.traces[:count])

    # -- steps -------------------------------------------------------------------------------

    def prefill(self) -> StepTrace:
        """All prompt tokens in one pass; their K/V fill the cache; the last position gives the first token."""
        if self.closed:
            raise GenerationStateError("the generation is closed")
        if self.traces:
            raise GenerationStateError("prefill() runs once, at the start; call step() to decode")
        with self._undone_on_error():
            with self.pool.block_manager.lock:
                cache = self.prefix_cache
                prefix = cache.attach(self.prompt_ids, self.table) if cache is not None else None
            start = self.table.length
            self._reused_window_kv = reused_window_kv(self.table, start)  # before the window can hand them back
            trace = self._run("prefill", self.prompt_ids[start:], list(range(start, len(self.prompt_ids))))
            trace.prefix = prefix
            return trace

    def step(self) -> StepTrace:
        """One decode step: the last sampled token goes in, the next token comes out."""
        if self.closed:
            raise GenerationStateError("the generation is closed")
        if not self.traces:
            raise GenerationStateError("call prefill() before step()")
        if self.finished:
            raise GenerationStateError(f"generation has ended ({self.stop_reason})")
        position = len(self.prompt_ids) + len(self.generated) - 1
        with self._undone_on_error():
            return self._run("decode", [self.generated[-1]], [position])

    def close(self) -> None:
        """Publish the prompt's K/V to the prefix cache (if any), then return this generation's blocks."""
        if self.closed:
            return
        with self.pool.block_manager.lock:
            if self.prefix_cache is not None and self.traces:
                self.prefix_cache.publish(self.prompt_ids, self.table)
            self.table.free()
        if self._replay is not None:
            self._replay.free()
            self._replay = None
        self._reused_window_kv = []
        self.closed = True

    def __enter__(self) -> Generation:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- history -----------------------------------------------------------------------------

    def rebuild(self, index: int) -> StepTrace:
        """Step `index`'s trace (0 = the prefill) with all its tensors, however old: one forward pass.

        The pass computes only that step's own input tokens and reads the K/V the cache holds for the
        positions before them (for a prefill after a prefix-cache hit: the reused ones). It writes
        nothing, so the pool, the cache and the generation are unchanged, and it needs no pool lock: the
        blocks it reads are this generation's own. Where a sliding window has handed back K/V that step read,
        they are recomputed first (`engine.replay`: the generation's passes again, once, in a pool of their own).
        The draw is made again with the same seed and step and must give the recorded token.
        """
        if self.closed:
            raise GenerationStateError("the generation is closed: its cached K/V are gone")
        if not is_integer(index) or not 0 <= index < len(self.traces):
            raise GenerationStateError(f"step {index!r} has not run; steps 0…{len(self.traces) - 1} have")
        original = self.traces[index]
        record = self.model.forward(
            original.input_ids,
            original.positions,
            self._table_after(original),
            self.capture,
            self.kv_splits,
            write=False,
            prefill=original.phase == "prefill",
        )
        token_id, stages = sample(record.logits, self.sampling, original.step)
        if token_id != original.token_id:
            raise RuntimeError(
                f"rebuilding step {index} drew token {token_id} where the run drew "
                f"{original.token_id}: the cached K/V no longer match the run"
            )
        return replace(
            original,
            candidates=candidates(stages, self.model.tokenizer, drawn=token_id),
            **self._heavy_fields(record, token_id, original.positions[-1] + 1),
        )

    # -- internals ---------------------------------------------------------------------------

    def _table_after(self, trace: StepTrace) -> BlockTable:
        """The table as it was after `trace`'s step; a view only: the generation holds the blocks' references.

        A sliding-window layer's blocks are the ones held now, while they still reach back to the window of that
        step's first position; once the window has handed them back, a replay's (`_replayed`)."""
        then = BlockTable(self.pool, blocks=list(trace.block_table), length=trace.context_length)
        window = self.table.window
        if window is not None:
            needed = max(0, trace.positions[0] - self.pool.window_size + 1)
            if window.first_position > needed:
                return self._replayed(trace)
            size = self.pool.block_size
            held = -(-trace.context_length // size) - window.dropped
            then.window = BlockTable(
                window.pool, blocks=window.blocks[:held], length=trace.context_length, dropped=window.dropped
            )
        return then

    def _replayed(self, trace: StepTrace) -> BlockTable:
        """The K/V `trace`'s step read, recomputed: the generation's passes before it replayed (once; a later call
        for an older step reads the same replay, one for a newer step extends it)."""
        if self._replay is None:
            capacity = min(len(self.prompt_ids) + self.max_new_tokens, self.model.info.context_limit)
            self._replay = Replay(self.model, self.pool.block_size, capacity, self.kv_splits)
            reused = self.traces[0].positions[0]  # the prefill's first computed position: what it reused
            self._replay.start_from(self.table, reused, self._reused_window_kv)
        self._replay.run_to(self.traces, trace.step)
        return self._replay.table_before(trace)

    @property
    def replay_nbytes(self) -> int:
        """The K/V a replay holds (0 until a step whose window was handed back is rebuilt)."""
        return self._replay.nbytes if self._replay is not None else 0

    @contextmanager
    def _undone_on_error(self) -> Iterator[None]:
        """A prefill or step as one transaction: if anything in it raises, the generation is put back as it
        was (block table and the blocks it took, tokens, traces, text), so a retry runs as on a fresh
        start. The blocks it allocated were never published, so no cache entry points at them."""
        mark = self.table.mark()
        generated, traces, stop_reason = len(self.generated), len(self.traces), self.stop_reason
        detokenizer = copy.copy(self.detokenizer)  # its state is immutable: a shallow copy is a snapshot
        try:
            yield
        except BaseException:
            with self.pool.block_manager.lock:
                self.table.roll_back(mark)
            del self.generated[generated:], self.traces[traces:]
            self.stop_reason, self.detokenizer = stop_reason, detokenizer
            raise

    def _run(self, phase: str, ids: list[int], positions: list[int]) -> StepTrace:
        model = self.model
        clock = Stopwatch()
        # bookkeeping only under the lock: forward passes of generations sharing the pool run at once
        with self.pool.block_manager.lock:
            placed = self.table.append(len(ids))
            reclaimed = self.prefix_cache.take_reclaimed() if self.prefix_cache is not None else []
        record = model.forward(ids, positions, self.table, self.capture, self.kv_splits, prefill=phase == "prefill")
        clock.lap("forward")
        step = len(self.traces)
        token_id, stages = sample(record.logits, self.sampling, step)
        clock.lap("sample")
        self.generated.append(token_id)
        self.stop_reason = stop_reason(
            token_id,
            model.eos_ids,
            len(self.generated),
            self.max_new_tokens,
            len(self.prompt_ids) + len(self.generated),
            model.info.context_limit,
        )
        tokenizer = model.tokenizer
        trace = StepTrace(
            step=step,
            phase=phase,
            input_ids=list(ids),
            positions=list(positions),
            kv_slots=placed,
            block_table=list(self.table.blocks),
            context_length=self.table.length,
            token_id=token_id,
            token=tokenizer.convert_ids_to_tokens(token_id),
            text=self.detokenizer.add(token_id, final=self.finished),
            candidates=candidates(stages, tokenizer, drawn=token_id),
            timings_ms={},
            stop_reason=self.stop_reason,
            reclaimed_blocks=reclaimed,
            **self._heavy_fields(record, token_id, positions[-1] + 1),
        )
        trace.timings_ms = clock.timings_ms()
        self.traces.append(trace)
        self._slim_old_traces()
        with self.pool.block_manager.lock:  # last, once nothing can fail: a sliding window's old blocks go back
            self.table.slide()
        if self.table.window is not None:  # what the step leaves in the sliding-window layers' table
            trace.window_block_table = list(self.table.window.blocks)
            trace.window_start = self.table.window.first_position
        return trace

    def _slim_old_traces(self) -> None:
        """Keep the tensors of the latest `keep_full_traces` steps, and of no more than fit in `full_trace_bytes`
        (the newest always keeps its own); slim the older ones (`rebuild` gives them back)."""
        kept = held = 0
        for index in range(len(self.traces) - 1, -1, -1):
            trace = self.traces[index]
            if trace.is_slim:
                break  # every older one is slim already
            held += trace.nbytes
            if kept and (
                kept >= self.keep_full_traces or self.full_trace_bytes is not None and held > self.full_trace_bytes
            ):
                self.traces[index] = trace.slimmed()
            else:
                kept += 1

    def _heavy_fields(self, record: ForwardRecord, token_id: int, position: int) -> dict:
        """A trace's tensors (`StepTrace.HEAVY`) from one forward pass and the id it drew for `position`."""
        return dict(
            logits=record.logits,
            attention=record.attention,
            scores=record.scores,
            attention_rows=record.attention_rows,
            residual=record.residual,
            final_hidden=record.final_hidden,
            split=record.split,
            next_input_embedding=self.model.next_input(token_id, position),
        )

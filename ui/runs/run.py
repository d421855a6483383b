"""Computed runs that pages read: a `Run` (a generation on its prefix cache, and what pages computed from it)
and a page's `Lease` on one, the single shape every source of runs hands out (`RunSource`): `OwnRuns` here, the
`RunStore` that shares runs between pages (`ui.runs.store`), the class's shared prefix cache (`ui.runs.classroom`).

Plain Python (no Streamlit). `step` counts generated tokens: 0 is the prompt alone, 1 is after the prefill.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import engine
from engine.busy_pool import BusyPoolPicture, BusyPoolReplay
from engine.tokens import TokenCell, candidate_cells, token_cells
from engine.trace import StepTrace
from ui.host import press_log
from ui.runs import turns
from ui.runs.memo import Memo

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
# A run's traces that keep their tensors hold at most this (with the newest always): an ordinary run keeps the
# latest KVSCOPE_FULL_TRACES or a few fewer (SmolLM2: ~1.5 MB a step at 500 positions; Gemma, its 262,144 logits:
# ~2.5 MB), a run in 64 KV splits (~6.5 MB a step, its split record) one or two: a class's heaviest links held
# eight. An older step is rebuilt by one forward pass when a page goes back to it.
TRACE_BYTES = 12 * 10**6
MEMO = 4  # rebuilt steps and attention heatmaps a run keeps for the pages reading it


class Run:
    """One computed run: a generation on a prefix cache, and what pages computed from it (rebuilt older steps,
    full attention heatmaps). A run is fully determined by its config and its cache's starting content (`seeds`),
    so pages with the same ones can read one run; stepping further extends it for all of them (under `lock`).

    cache: the class's shared prefix cache, or None for a cache of the run's own that first prefills `seeds`
    (the prompts its page published before, in order).
    """

    def __init__(
        self,
        model: engine.Model,
        config: RunConfig,
        keep_full_traces: int,
        pool_tokens: int,
        seeds: Seeds = (),
        cache: engine.PrefixCache | None = None,
    ):
        self.model = model
        self.config = config
        self.seeds = seeds
        self.lock = turns.TurnLock()  # stepping; a shared pool has its own lock for bookkeeping
        if cache is None:
            tokens = max(pool_tokens, config.max_prompt_tokens + config.max_new_tokens)  # always one longest run
            cache = engine.PrefixCache(
                model,
                policy=config.policy,
                block_size=config.block_size,
                capacity_blocks=-(-tokens // config.block_size) + 2,
            )
            for ids in seeds:
                with engine.Generation(
                    model, list(ids), prefix_cache=cache, max_new_tokens=1, keep_full_traces=1, capture=engine.NO_RECORD
                ) as seed:
                    seed.prefill()  # it only fills the cache: closing publishes its prompt's K/V
        self.cache = cache
        generation = engine.Generation(
            model,
            config.prompt,
            chat=config.chat,
            think=config.think,
            sampling=config.sampling,
            block_size=config.block_size,
            max_new_tokens=config.max_new_tokens,
            kv_splits=config.kv_splits,
            prefix_cache=cache,
            keep_full_traces=keep_full_traces,
            full_trace_bytes=TRACE_BYTES,
            capture=CAPTURE,
        )
        if len(generation.prompt_ids) > config.max_prompt_tokens:
            generation.close()
            raise engine.PromptTooLongError(
                f"the prompt is {len(generation.prompt_ids)} tokens; this app allows at most {config.max_prompt_tokens}"
            )
        self.generation = generation
        self._rebuilt = Memo(MEMO)  # step → its rebuilt trace
        self._attention = Memo(MEMO)  # (layer, head) → (probs, scores)
        self._cells = Memo(MEMO)  # tokens generated → the token cells
        self._candidates = Memo(MEMO)  # (step, candidate ids) → their cells
        self._busy: BusyPoolReplay | None = None  # this run replayed in a busy pool, as far as a page asked
        self._busy_pictures: list[BusyPoolPicture] = []  # step s's picture at s − 1 (plain data)

    def advance_to(self, step: int, progress: Callable[[int], None] | None = None) -> int:
        """Run prefill/decode until `step` tokens exist (or the run ends); return the step reached. Long work shares
        the page's turn (`turns.share`) between two layers of a pass, and between two passes with the run's lock let
        go: a long catch-up or prefill does not hold up the pages waiting behind it. `progress(tokens)` is told after
        each pass but the last."""
        generation = self.generation
        while True:
            with self.lock, engine.between_layers(turns.share):
                if self._short_of(step):
                    with press_log.timed("engine"):
                        generation.step() if generation.traces else generation.prefill()
                if not self._short_of(step):  # no turn shared after the last pass: the page draws next
                    return min(step, len(generation.generated))
            if progress is not None:
                progress(len(generation.generated))
            turns.share()

    @contextmanager
    def _computing(self) -> Iterator[None]:
        """Work on the run besides its steps (a slimmed step rebuilt, a layer's attention by a fresh prefill, the
        busy pool's replay): under its lock, and, as its steps do, sharing the page's turn between two layers of a
        pass (a heavy link's rebuild held its turn for 50 s on the AVX2 VM before), recorded as the engine's time."""
        with self.lock, engine.between_layers(turns.share), press_log.timed("engine"):
            yield

    def _short_of(self, step: int) -> bool:
        """Whether another pass is needed for `step` tokens (a prefill first)."""
        generation = self.generation
        return (step >= 1 and not generation.traces) or (len(generation.generated) < step and not generation.finished)

    def trace(self, step: int) -> StepTrace | None:
        """The trace that produced token `step` (1-based), with its tensors: if it was slimmed, rebuilt by one
        forward pass over the K/V the run's cache holds (kept for the next pages that draw it)."""
        if step < 1 or step > len(self.generation.traces):
            return None
        trace = self.generation.traces[step - 1]
        if not trace.is_slim:
            return trace
        with self._computing():
            return self._rebuilt.made(step, lambda: self.generation.rebuild(step - 1))

    @functools.cached_property
    def prompt_text(self) -> str:
        """The prompt as the model read it (its template's text included)."""
        return self.model.tokenizer.decode(self.generation.prompt_ids)

    def cells(self, step: int) -> list[TokenCell]:
        """The prompt's tokens and the first `step` generated ones, one cell each: made once for every page that
        draws this step (a class following one teacher), and only read by them."""
        generation = self.generation
        count = min(step, len(generation.generated))  # a step not reached yet is never kept under its number
        return self._cells.made(
            count, lambda: token_cells(self.model.tokenizer, generation.prompt_ids, generation.generated[:count])
        )

    def candidate_cells(self, step: int, candidate_ids: list[int]) -> list[TokenCell]:
        """The candidates for token `step` (1-based), each as the cell it would become after the tokens before it
        (see `engine.tokens.candidate_cells`); made once for every page that draws them, and only read."""

        def made() -> list[TokenCell]:
            generation = self.generation
            context = (generation.prompt_ids + generation.generated)[: len(generation.prompt_ids) + step - 1]
            return candidate_cells(self.model.tokenizer, context, candidate_ids)

        return self._candidates.made((step, tuple(candidate_ids)), made)

    def full_attention(self, step: int, layer: int, head: int):
        """Probabilities and scores (n, n) of one head of `layer` over the sequence step `step` attended.

        Computed once by a fresh prefill, then grown row by row from the decode steps' own recorded
        rows, so stepping forward costs one row, not a prefill. Only the shown heads are kept.
        """
        generation = self.generation
        n = len(generation.prompt_ids) + max(0, step - 1)
        with self._computing():
            kept = self._attention.get((layer, head))
            if kept is not None:
                probs, scores = kept
                while probs.shape[0] < n and (row := self._decode_row(probs.shape[0] + 1, layer, head)) is not None:
                    probs, scores = _grow(probs, row[0], 0.0), _grow(scores, row[1], float("-inf"))
                self._attention.put((layer, head), (probs, scores))
                if probs.shape[0] >= n:
                    return probs[:n, :n], scores[:n, :n]
            probs, scores = self.model.full_attention(generation.ids[:n], layer, self.config.block_size)
            return self._attention.put((layer, head), (probs[head].clone(), scores[head].clone()))

    def _decode_row(self, length: int, layer: int, head: int):
        """The row a decode step recorded when the sequence reached `length` positions, if still kept."""
        index = length - len(self.generation.prompt_ids)  # traces[index] is that decode step
        if not 1 <= index < len(self.generation.traces):
            return None
        trace = self.generation.traces[index]
        if trace.is_slim:
            return None
        return trace.attention[layer, head, 0], trace.scores[layer, head, 0]

    def cached_kv(self, layer: int, length: int):
        """What this run's cache holds for `layer` among the first `length` positions: K and V, (n, kv_heads,
        head_dim) each, and the position they start at. A global layer holds them all (start 0); a sliding-window
        layer (Gemma 3) only its last positions, in whole blocks, and none (n = 0, start ≥ `length`) at an early
        step the window has long passed."""
        with self.lock:
            k, v, start = self.generation.table.read(layer)
        held = max(0, length - start)
        return k[:held], v[:held], start

    def busy_pool(self, step: int) -> BusyPoolPicture:
        """The first `step` steps of this run replayed in a pool other requests used first (engine.busy_pool),
        compared with this run's own K/V. One replay per run, a pass further for each step further than any
        page asked before, and every step's picture kept: going back costs no forward pass."""
        with self._computing():
            generation = self.generation
            if self._busy is None:
                prompt = generation.prompt_ids
                self._busy = BusyPoolReplay(
                    self.model,
                    [(prompt, list(range(len(prompt))))],
                    self.config.block_size,
                    capacity=len(prompt) + self.config.max_new_tokens,
                )
            replay, pictures = self._busy, self._busy_pictures
            while len(pictures) < max(1, step):
                if pictures:  # step 1's pass is the prefill, made with the replay
                    trace = generation.traces[len(pictures)]
                    replay.add(trace.input_ids, trace.positions)
                pictures.append(replay.picture(lambda layer: self.cached_kv(layer, replay.table.length)))
            return pictures[max(1, step) - 1]

    @property
    def nbytes(self) -> int:
        """What this run holds: its traces' tensors, the K/V of its cache's written blocks (and of a replay past a
        sliding window), its memos."""
        pool = self.cache.pool
        kv = (pool.block_manager.used + self.cache.cached_free_blocks()) * pool.block_size * pool.bytes_per_token
        memo = sum(t.nbytes for t in self._rebuilt.values())
        memo += sum(p.nbytes + s.nbytes for p, s in self._attention.values())  # a copy: other pages add to it
        memo += self._busy.nbytes if self._busy is not None else 0
        return sum(t.nbytes for t in self.generation.traces) + kv + memo + self.generation.replay_nbytes

    @property
    def closed(self) -> bool:
        return self.generation.closed

    def close(self) -> None:
        """Publish the prompt to the cache (if prefilled) and give the blocks back: for a run on the class's cache."""
        with self.lock:
            self.generation.close()
            self._busy, self._busy_pictures = None, []


RunBuilder = Callable[..., Run]  # Run(model, config, …) with only `seeds=` or `cache=` left to give


class Lease:
    """A page's hold on the run it reads, whatever its source. This base is a run of the page's own: nobody else
    reads it, so holding, growing and releasing it cost nothing."""

    def __init__(self, run: Run):
        self.run = run

    def renew(self) -> None:
        """The page reads the run again (an open page is not idle)."""

    @contextmanager
    def held(self) -> Iterator[Run]:
        """The run, renewed and kept for the page while it steps it."""
        self.renew()
        yield self.run

    def grown(self) -> None:
        """The run stepped further: it may now hold more memory."""

    def make_room(self) -> bool:
        """The run's pool is full: take back what pages that left still hold. Whether any came back."""
        return False

    def release(self) -> None:
        """The page leaves the run."""


class RunSource(Protocol):
    def lease(self, config: RunConfig, seeds: Seeds, build: RunBuilder) -> Lease:
        """A lease on the run of `config` whose prefix cache starts with `seeds` (a source with a cache of its
        own ignores them), built by `build` if the source has none to hand out."""


class OwnRuns:
    """Every page's runs are its own (a bench, a test): no sharing."""

    def lease(self, config: RunConfig, seeds: Seeds, build: RunBuilder) -> Lease:
        return Lease(build(seeds=seeds))


def _grow(matrix, row, future: float):
    """Append one query row (length n+1) to an n × n causal matrix; earlier rows get `future` for the
    new key they cannot see (0 for probabilities, −inf for scores)."""
    n = matrix.shape[0]
    grown = matrix.new_full((n + 1, n + 1), future)
    grown[:n, :n] = matrix
    grown[n] = row
    return grown

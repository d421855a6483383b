"""A greedy run whose KV cache evicts positions by a policy, as kvpress's pipeline runs a press.

    run = EvictionRun(model, prompt_ids, Policy("snapkv", window_size=8), compression_ratio=0.5)
    first = run.prefill()        # context = prompt[:-1] prefilled in full, evicted; the last prompt token reads
    while not run.finished:      # the evicted cache and gives the first answer token
        step = run.step()
    run.close()

Two ways to evict, alone or together (kvpress's press, DecodingPress, PrefillDecodingPress):
- once after the context's prefill, at `compression_ratio`: every (layer, KV head) keeps
  int(n × (1 − ratio)) of the n context positions, the ones its scores rank highest;
- during decode, to a `DecodeBudget`: every `interval` passes (the last prompt token's pass is the first), after
  that pass's attention, each (layer, KV head) holding more than `target_size` rows keeps `target_size`,
  scored from that pass (kvpress's DecodingPress); or a `StreamingWindow`: after every pass, the first `n_sink`
  positions held and the latest `window` (StreamingLLM's streaming form, by position); `engine.eviction.budgets`.

Masked, not freed: the paged cache keeps every position's K/V (each rotated at its own position) and each
layer's attention reads only the positions its KV heads kept (`LayerRows.mask`). `kept_bytes` counts what the
rows hold (what a compacted cache such as kvpress's holds), `allocated_bytes` what the paged blocks under
them take, `full_bytes` what the cache would hold without eviction. Sliding-window layers (Gemma 3's local
layers) are left to their window, as kvpress leaves them.

Re-rotated positions (`rerotate=True`): kvpress's KeyRerotationPress around a policy's eviction after the prefill
(`engine.eviction.rerotation`); `evicted_share` then compares with keys at their first positions.
"""

from __future__ import annotations

import math

import torch

from engine.attention import AttentionResult
from engine.checks import require_integer
from engine.errors import GenerationStateError
from engine.eviction.budgets import HIDDEN_STATES_BUFFER, DecodeBudget, StreamingWindow
from engine.eviction.evict import evict_by_position, evict_by_score, evicted_share
from engine.eviction.policies import Policy
from engine.eviction.records import Eviction, EvictionStep
from engine.eviction.rerotation import rerotation
from engine.eviction.rows import LayerRows
from engine.eviction.settings import check_run
from engine.kv_cache import DEFAULT_BLOCK_SIZE, BlockPool, BlockTable, kv_bytes_per_token
from engine.model import Model
from engine.passes import Observer, Pass
from engine.recorder import ForwardRecord
from engine.stopping import stop_reason
from engine.trace import NO_RECORD, Capture

ONE_ROW = Capture(residuals=False)  # a pass's attention row: what the evictions and the view read


class EvictionRun:
    """Greedy decoding of `prompt_ids` with an evicting KV cache (see the module docstring)."""

    def __init__(
        self,
        model: Model,
        prompt_ids: list[int],
        policy: Policy | None = None,
        *,
        compression_ratio: float = 0.0,
        budget: DecodeBudget | StreamingWindow | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        max_new_tokens: int = 32,
        keep_full_steps: int = 32,
        pool: BlockPool | None = None,
        rerotate: bool = False,
    ):
        """`pool`: a pool shared with other runs of the prompt (`engine.eviction.batch`), which then give this run
        its table after their common prefill; by default a pool of its own. `rerotate`: kvpress's
        KeyRerotationPress around the policy (see the module docstring)."""
        check_run(model, prompt_ids, policy, compression_ratio, budget, max_new_tokens, keep_full_steps, rerotate)
        self.model, self.policy, self.budget = model, policy, budget
        self.compression_ratio = compression_ratio
        self.prompt_ids = list(prompt_ids)
        self.max_new_tokens = max_new_tokens
        self.keep_full_steps = keep_full_steps
        capacity = min(len(self.prompt_ids) + max_new_tokens, model.info.context_limit)
        self.table = BlockTable(pool or model.new_pool(math.ceil(capacity / block_size), block_size))
        info = model.info
        self.evicting = [i for i in range(info.layers) if info.window(i) is None]  # layers eviction applies to
        self.rows: dict[int, LayerRows] = {}
        self.prefill_evictions: list[Eviction | None] = [None] * info.layers
        self.steps: list[EvictionStep] = []
        self.generated: list[int] = []
        self.passes_since_eviction = 0
        self.rerotate = rerotate
        self._rerotated: tuple[int, list[torch.Tensor | None]] | None = None  # made after the prefill's evictions
        # ExpectedAttention during decode: per layer, the queries (before RoPE) of the passes since the last
        # eviction, at most HIDDEN_STATES_BUFFER + 1 (DecodingPress's buffer of hidden states)
        self._queries: dict[int, list[torch.Tensor]] = {}
        self.closed = False

    # -- state ---------------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self._stops(ignore_eos=False)

    @property
    def _out_of_room(self) -> bool:
        """max_new_tokens passes have run, or the next would pass the context limit (an EOS read by teacher forcing
        goes on)."""
        return self._stops(ignore_eos=True)

    def _stops(self, ignore_eos: bool) -> bool:
        return (
            bool(self.generated)
            and stop_reason(
                self.generated[-1],
                self.model.eos_ids,
                len(self.generated),
                self.max_new_tokens,
                self.table.length + 1,
                self.model.info.context_limit,
                ignore_eos,
            )
            is not None
        )

    def kept_positions(self, layer: int, kv_head: int) -> list[int]:
        """The positions (layer, KV head) holds now, ascending; every cached one for a sliding-window layer's
        window."""
        if layer not in self.rows:
            start = self.table.length - self.model.info.cached_positions(layer, self.table.length)
            return list(range(start, self.table.length))
        return self.rows[layer].held_positions(kv_head)

    def kept_bytes(self) -> int:
        """Bytes of the K/V every (layer, KV head) holds: what a cache that drops evicted rows keeps."""
        info = self.model.info
        per_row = kv_bytes_per_token(1, 1, info.head_dim, info.element_bytes)  # K and V of one head, one position
        held = sum(
            int(self.rows[i].counts.sum())
            if i in self.rows
            else info.kv_heads * info.cached_positions(i, self.table.length)
            for i in range(info.layers)
        )
        return held * per_row

    def allocated_bytes(self) -> int:
        """Bytes of the paged blocks the run holds (masking frees none of them)."""
        total = 0
        for table in (self.table, self.table.window):
            if table is not None:
                layers, _, size, kv_heads, head_dim = table.pool.k.shape
                total += (
                    len(table.blocks)
                    * size
                    * kv_bytes_per_token(layers, kv_heads, head_dim, table.pool.k.element_size())
                )
        return total

    def full_bytes(self) -> int:
        """Bytes the cache would hold for the same positions without eviction."""
        return self.model.info.kv_bytes(self.table.length)

    def records_nbytes(self) -> int:
        """Bytes of what the run keeps about its passes: each step's masks, shares, latest attention and logits,
        and every eviction's rows and scores (the K/V are the pool's: `allocated_bytes`)."""

        def tensors(step: EvictionStep) -> list[torch.Tensor | None]:
            return [*(step.kept or ()), step.logits, step.attention, step.evicted_share]

        evictions = [e for step in self.steps for e in step.evictions if e is not None]
        evictions += [e for e in self.prefill_evictions if e is not None]
        held = [t for step in self.steps for t in tensors(step)]
        held += [t for e in evictions for t in (e.positions, e.scores, e.kept_rows, e.held)]
        return sum(t.nbytes for t in held if t is not None)

    # -- passes --------------------------------------------------------------------------------

    def prefill(self) -> EvictionStep:
        """The context (the prompt but its last token) in one pass, in full; then the evictions after a prefill;
        then the last prompt token over what was kept: its logits give the first answer token."""
        context = self.prompt_ids[:-1]
        n = len(context)
        observe = self.start_prefill(self.table)
        self.table.append(n)
        self.model.forward(context, list(range(n)), self.table, NO_RECORD, observe=observe)
        self.table.slide()
        return self._solo_pass(self.prompt_ids[-1], n)

    def start_prefill(self, table: BlockTable) -> Observer | None:
        """Ready the rows for the context's prefill into `table` (this run's, or one its batch shares); what
        must observe that prefill's attention to evict after it (None: nothing to evict)."""
        if self.closed:
            raise GenerationStateError("the run is closed")
        if self.steps:
            raise GenerationStateError("prefill() runs once, at the start; call step() to decode")
        n = len(self.prompt_ids) - 1
        self.rows = {i: LayerRows(self.model.info.kv_heads, n, self.model.device) for i in self.evicting}
        return self._prefill_evictor(n, table) if self.compression_ratio > 0 else None

    def step(self, input_id: int | None = None) -> EvictionStep:
        """One token in, the next out, over what each (layer, KV head) kept. The token in is the last greedy one,
        or `input_id`: teacher forcing, a given text read pass by pass (a greedy EOS does not end it; only
        max_new_tokens passes or the context limit do)."""
        if self.closed:
            raise GenerationStateError("the run is closed")
        if not self.steps:
            raise GenerationStateError("call prefill() before step()")
        if self.finished if input_id is None else self._out_of_room:
            raise GenerationStateError("the run has ended")
        if input_id is not None:
            require_integer("input_id", input_id, 0, self.model.info.vocab - 1)
        return self._solo_pass(self.generated[-1] if input_id is None else input_id, self.table.length)

    def close(self) -> None:
        if not self.closed:
            self.table.free()
            self.closed = True

    # -- internals -----------------------------------------------------------------------------

    def _solo_pass(self, token_id: int, position: int) -> EvictionStep:
        opened = self.open_pass(token_id, position)
        return self.close_pass(opened, self.model.forward_batch([opened])[0])

    def open_pass(self, token_id: int, position: int) -> Pass:
        """Reserve `position` for `token_id` and say what the pass reads: its part of a (batched) forward pass,
        whose record `close_pass` takes."""
        self.table.append(1)
        for rows in self.rows.values():
            rows.append(position, 1)
        length = position + 1
        kept = [self.rows[i].mask(length) if i in self.rows else None for i in range(self.model.info.layers)]
        if not self.rerotate:
            return Pass([token_id], [position], self.table, ONE_ROW, kept=kept, observe=self._decode_observer())
        shift, turns = self._rerotation()
        return Pass(
            [token_id], [position], self.table, ONE_ROW, kept=kept, rope_positions=[position + shift], key_turns=turns
        )

    def close_pass(self, opened: Pass, record: ForwardRecord) -> EvictionStep:
        """The step the opened pass made (`record`), and the evictions after it."""
        self.table.slide()
        token_id, position, kept = opened.ids[0], opened.positions[0], opened.kept
        probs, scores = record.attention[:, :, -1], record.scores[:, :, -1]  # (layers, q_heads, L)
        step = EvictionStep(
            step=len(self.steps),
            position=position,
            input_id=token_id,
            token_id=int(record.logits.argmax()),
            kept=[m.cpu() if m is not None else None for m in kept],
            logits=record.logits,
            attention=probs,
            evicted_share=evicted_share(scores, kept, self.model.info.gqa_group),
            evictions=self._evict_after_pass(record.attention),
            final_hidden=record.final_hidden,
        )
        self.generated.append(step.token_id)
        self.steps.append(step)
        if len(self.steps) > self.keep_full_steps:
            old = self.steps[-self.keep_full_steps - 1]
            old.logits = old.attention = old.kept = old.final_hidden = None
        return step

    def _prefill_evictor(self, n: int, table: BlockTable) -> Observer:
        """What evicts each layer during the context's prefill into `table`, as soon as its attention has run: only
        the query rows the policy reads are held, and only that layer's, never every layer's n × n at once."""
        self.policy.check_rows(n, n)
        rows, layers = self.policy.query_rows(n), self.model.info.layers

        def observe(layer: int, result: AttentionResult, q: torch.Tensor) -> None:
            if layer in self.rows:
                probs = result.probs[:, -rows:] if rows else None
                n_kept = self.policy.layer_budget(n, self.compression_ratio, layer, layers)
                self.prefill_evictions[layer] = self._evict_by_score(layer, probs, n_kept, table, q.transpose(0, 1))

        return observe

    def _decode_observer(self) -> Observer | None:
        """What keeps each decode pass's queries for ExpectedAttention's next eviction (None: nothing to keep)."""
        if not (isinstance(self.budget, DecodeBudget) and self.policy.reads_queries):
            return None

        def observe(layer: int, result: AttentionResult, q: torch.Tensor) -> None:
            if layer in self.rows:
                self._queries.setdefault(layer, []).append(q.transpose(0, 1))

        return observe

    def _evict_after_pass(self, attention: torch.Tensor) -> list[Eviction | None]:
        """The decode-time evictions after a pass whose attention (layers, q_heads, 1, L) was recorded."""
        evictions: list[Eviction | None] = [None] * self.model.info.layers
        budget = self.budget
        if isinstance(budget, StreamingWindow):
            for layer in self.evicting:
                evictions[layer] = evict_by_position(self.rows[layer], budget)
        elif isinstance(budget, DecodeBudget):
            self.passes_since_eviction += 1
            if self.passes_since_eviction >= budget.interval:
                queries = min(self.passes_since_eviction, HIDDEN_STATES_BUFFER + 1)
                for layer in self.evicting:
                    buffered = self._queries.pop(layer, None)
                    if self.rows[layer].count > budget.target_size:
                        self.policy.check_rows(self.rows[layer].count, queries)
                        probs = attention[layer].to(self.model.device)
                        evictions[layer] = self._evict_by_score(
                            layer, probs, budget.target_size, queries=(torch.cat(buffered, dim=1) if buffered else None)
                        )
                self.passes_since_eviction = 0
            for layer, buffered in self._queries.items():
                del buffered[:-HIDDEN_STATES_BUFFER]
        return evictions

    def _evict_by_score(
        self,
        layer: int,
        probs: torch.Tensor | None,
        n_kept: int,
        table: BlockTable | None = None,
        queries: torch.Tensor | None = None,
    ) -> Eviction:
        """`evict_by_score` on layer `layer`'s rows, its K/V read from `table` (by default the run's own)."""
        keys, values, _ = (table or self.table).read(layer)
        rope = self.model.layers[layer].rope
        return evict_by_score(self.rows[layer], self.policy, keys, values, probs, n_kept, queries, rope)

    def _rerotation(self) -> tuple[int, list[torch.Tensor | None]]:
        """The prefill's evictions re-rotated (`engine.eviction.rerotation`), worked out once, at the first pass."""
        if self._rerotated is None:
            context = len(self.prompt_ids) - 1
            self._rerotated = rerotation(self.prefill_evictions, context, self.model.info, self.model.device)
        return self._rerotated

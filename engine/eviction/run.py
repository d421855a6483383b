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
  positions held and the latest `window` (StreamingLLM's streaming form, by position).

Masked, not freed: the paged cache keeps every position's K/V (each rotated at its own position) and each
layer's attention reads only the positions its KV heads kept (`LayerRows.mask`). `kept_bytes` counts what the
rows hold (what a compacted cache such as kvpress's holds), `allocated_bytes` what the paged blocks under
them take, `full_bytes` what the cache would hold without eviction. Sliding-window layers (Gemma 3's local
layers) are left to their window, as kvpress leaves them.

Re-rotated positions (`rerotate=True`, kvpress's KeyRerotationPress around a policy's eviction after the prefill):
the keys each (layer, KV head) kept of the n context positions are read turned to the positions 0 … n_kept − 1,
in their order, and the last prompt token and the answer go on from position n_kept, as kvpress's pipeline
places them; the cache still holds every key as written (a turn composes with the rotation already in it).
`evicted_share` then compares with keys at their first positions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from engine.attention import AttentionResult
from engine.checks import require_integer, require_number
from engine.errors import InvalidSettingError, SessionStateError
from engine.eviction.policies import PREFILL_ONLY, LayerInputs, Policy, select, select_per_head
from engine.eviction.rows import LayerRows
from engine.kv_cache import DEFAULT_BLOCK_SIZE, BlockPool, BlockTable, kv_bytes_per_token
from engine.model import Model, Observer, Pass
from engine.recorder import ForwardRecord
from engine.settings import check_prompt_fits
from engine.stopping import stop_reason
from engine.trace import NO_RECORD, Capture

ONE_ROW = Capture(residuals=False)  # a pass's attention row: what the evictions and the view read
HIDDEN_STATES_BUFFER = 256  # DecodingPress's default: how many of the latest passes it scores from, at most


@dataclass(frozen=True)
class DecodeBudget:
    """kvpress's DecodingPress: every `interval` decode passes, compress each (layer, KV head) to `target_size`."""

    target_size: int
    interval: int = 512

    def __post_init__(self):
        for name in ("target_size", "interval"):
            require_integer(f"the decode budget's {name}", getattr(self, name), 1)


@dataclass(frozen=True)
class StreamingWindow:
    """StreamingLLM's streaming form: after every pass keep the first `n_sink` positions and the latest `window`."""

    n_sink: int = 4
    window: int = 60

    def __post_init__(self):
        for name, least in (("n_sink", 0), ("window", 1)):
            require_integer(f"the streaming window's {name}", getattr(self, name), least)

    def keep(self, positions: torch.Tensor) -> torch.Tensor | None:
        """The rows each KV head keeps of rows holding `positions` (kv_heads, n): the `n_sink` with the first
        positions and the latest `window`, (kv_heads, n_sink + window); None while n is no more than that."""
        if positions.shape[1] <= self.n_sink + self.window:
            return None
        order = positions.argsort(dim=1)  # rows by position
        return torch.cat((order[:, : self.n_sink], order[:, -self.window :]), dim=1)

    def sink_turns(self, length: int) -> torch.Tensor:
        """(length,) long: how far the pass at position p moves the sinks up when positions are numbered inside the
        cache (the StreamingLLM paper's): the sinks at 0 … n_sink − 1, then the window it reads, with no gap.
        It reads the latest window + 1 positions p − window … p; they start right after the sinks once
        p − window > n_sink."""
        return (torch.arange(length) - self.window - self.n_sink).clamp(min=0)

    def reads(self, length: int) -> torch.Tensor:
        """(length, length) bool: row p is what the pass at position p reads when the window streams from
        position 0 (each pass appends its position, reads, then `keep`s): a teacher-forced pass over many
        positions masks each query with its row (`engine.eviction.nll`)."""
        rows = LayerRows(1, 0, torch.device("cpu"))
        reads = torch.zeros(length, length, dtype=torch.bool)
        for p in range(length):
            rows.append(p, 1)
            reads[p] = rows.mask(length)[0]
            kept = self.keep(rows.positions)
            if kept is not None:
                rows.keep(kept)
        return reads


@dataclass
class Eviction:
    """One layer's eviction: its rows before (positions, (kv_heads, n)), their scores, and the rows kept."""

    positions: torch.Tensor  # (kv_heads, n) long
    scores: torch.Tensor | None  # (kv_heads, n) float; None for the streaming window (it keeps by position)
    kept_rows: torch.Tensor  # (kv_heads, n_kept) long, indices into the rows, in the cache's new order
    held: torch.Tensor | None = None  # AdaKV: (kv_heads, n) bool, the rows each head reads (kept_rows: all of them)

    @property
    def kept_positions(self) -> torch.Tensor:
        """(kv_heads, n_kept) the positions kept, ascending (every head keeps as many: not AdaKV's)."""
        return self.positions.gather(1, self.kept_rows).sort(dim=1).values


@dataclass
class EvictionStep:
    """One pass over the evicted cache: the last prompt token (step 0) or one answer token."""

    step: int
    position: int
    input_id: int
    token_id: int  # greedy: the argmax of the logits
    # Dropped (None) once the step is older than the run's `keep_full_steps`, so a long run's memory stays bounded:
    kept: list[torch.Tensor | None] | None  # per layer: (kv_heads, position + 1) bool, what this pass's attention read
    logits: torch.Tensor | None  # (vocab,) float32
    attention: torch.Tensor | None  # (layers, q_heads, position + 1): the probabilities it used (0 where evicted)
    evicted_share: torch.Tensor  # (layers, q_heads): the share full attention puts on the positions `kept` hid
    evictions: list[Eviction | None]  # per layer: what was evicted after this pass (None: nothing)


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
        require_number(
            "compression_ratio", compression_ratio, 0, 1, high_open=True, why=" (the share of positions evicted)"
        )
        if rerotate:
            _check_rerotation(model, policy, compression_ratio, budget)
        if policy is None and (compression_ratio > 0 or isinstance(budget, DecodeBudget)):
            raise InvalidSettingError("a compression ratio or a decode budget needs a policy to score positions")
        if budget is not None and not isinstance(budget, (DecodeBudget, StreamingWindow)):
            raise InvalidSettingError(f"budget must be a DecodeBudget or a StreamingWindow, got {budget!r}")
        require_integer("max_new_tokens", max_new_tokens, 1)
        require_integer("keep_full_steps", keep_full_steps, 1)
        if len(prompt_ids) < 2:
            raise InvalidSettingError(
                "eviction needs a prompt of at least 2 tokens: the context it evicts from, "
                "then the last prompt token that reads what was kept"
            )
        if isinstance(budget, DecodeBudget):
            check_budget(policy, budget)
        check_prompt_fits(list(prompt_ids), model)
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
            raise SessionStateError("the run is closed")
        if self.steps:
            raise SessionStateError("prefill() runs once, at the start; call step() to decode")
        n = len(self.prompt_ids) - 1
        self.rows = {i: LayerRows(self.model.info.kv_heads, n, self.model.device) for i in self.evicting}
        return self._prefill_evictor(n, table) if self.compression_ratio > 0 else None

    def step(self, input_id: int | None = None) -> EvictionStep:
        """One token in, the next out, over what each (layer, KV head) kept. The token in is the last greedy one,
        or `input_id`: teacher forcing, a given text read pass by pass (a greedy EOS does not end it; only
        max_new_tokens passes or the context limit do)."""
        if self.closed:
            raise SessionStateError("the run is closed")
        if not self.steps:
            raise SessionStateError("call prefill() before step()")
        if self.finished if input_id is None else self._out_of_room:
            raise SessionStateError("the run has ended")
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
            evicted_share=self._evicted_share(scores, kept),
            evictions=self._evict_after_pass(record.attention),
        )
        self.generated.append(step.token_id)
        self.steps.append(step)
        if len(self.steps) > self.keep_full_steps:
            old = self.steps[-self.keep_full_steps - 1]
            old.logits = old.attention = old.kept = None
        return step

    def _evicted_share(self, scores: torch.Tensor, kept: list[torch.Tensor | None]) -> torch.Tensor:
        """(layers, q_heads): softmax of the full scores (no eviction) summed over what `kept` hid."""
        full = torch.softmax(scores.float(), dim=-1)
        group = self.model.info.gqa_group
        hidden = torch.stack(
            [
                torch.zeros(scores.shape[1:], dtype=torch.bool)
                if m is None
                else ~m.cpu().repeat_interleave(group, dim=0)
                for m in kept
            ]
        )
        return (full * hidden).sum(dim=-1)

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
                evictions[layer] = self._evict_by_position(layer, budget)
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
        """Score layer `layer`'s rows by the policy and keep the `n_kept` best of each KV head (its K/V read from
        `table`, by default the run's own; `queries` (q_heads, t, D) before RoPE: the passes that score)."""
        rows, policy = self.rows[layer], self.policy
        keys, values, _ = (table or self.table).read(layer)
        inputs = LayerInputs(rows.gather_keys(keys), rows.gather_probs(probs) if probs is not None else None)
        if policy.reads_values:
            inputs.values = rows.gather_keys(values)
        if policy.reads_queries:
            inputs.queries = queries
            future = torch.arange(queries.shape[1], queries.shape[1] + policy.n_future_positions)
            inputs.future_rope = self.model.layers[layer].rope.cos_sin(future.to(self.model.device), keys.dtype)
        scores = policy.score(inputs, n_kept)
        if policy.name == "adakv":  # every row stays, each head hides its own
            held = select_per_head(scores, n_kept, policy.alpha_safeguard)
            every = torch.arange(rows.count).expand(held.shape[0], -1)
            eviction = Eviction(rows.positions.cpu(), scores.float().cpu(), every, held.cpu())
            rows.hide(held)
            return eviction
        eviction = Eviction(rows.positions.cpu(), scores.float().cpu(), select(scores, n_kept).cpu())
        rows.keep(eviction.kept_rows.to(rows.positions.device))
        return eviction

    def _rerotation(self) -> tuple[int, list[torch.Tensor | None]]:
        """kvpress's KeyRerotationPress after the prefill's evictions: each (layer, KV head) keeps n_kept context
        keys, turned to the positions 0 … n_kept − 1 in their order (per layer (kv_heads, context): the turn of
        each kept key, new position − old), and the passes after it go on from position n_kept: the shift of
        their rotary positions from their cache positions."""
        if self._rerotated is None:
            context, info = len(self.prompt_ids) - 1, self.model.info
            turns: list[torch.Tensor | None] = [None] * info.layers
            for layer, eviction in enumerate(self.prefill_evictions):
                if eviction is None:
                    continue
                kept = eviction.kept_positions  # (kv_heads, n_kept), ascending
                turn = torch.zeros(info.kv_heads, context, dtype=torch.long)
                turn.scatter_(1, kept, torch.arange(kept.shape[1]).expand_as(kept) - kept)
                turns[layer] = turn.to(self.model.device)
            # the passes go on from the first layer's count, as kvpress's pipeline reads the cache's length there
            first = next(e for e in self.prefill_evictions if e is not None)
            self._rerotated = (first.kept_rows.shape[1] - context, turns)
        return self._rerotated

    def _evict_by_position(self, layer: int, window: StreamingWindow) -> Eviction | None:
        rows = self.rows[layer]
        kept = window.keep(rows.positions)
        if kept is None:
            return None
        eviction = Eviction(rows.positions.cpu(), None, kept.cpu())
        rows.keep(kept)
        return eviction


def _check_rerotation(
    model: Model, policy: Policy | None, compression_ratio: float, budget: DecodeBudget | StreamingWindow | None
) -> None:
    """Re-rotation is kvpress's KeyRerotationPress: around a policy's eviction after the prefill, on a model whose
    every layer evicts (Gemma 3's sliding-window layers keep their own positions) and rotates its keys (RoPE)."""
    if policy is None or compression_ratio <= 0 or budget is not None:
        raise InvalidSettingError(
            "re-rotation turns the keys a policy keeps after the prefill: it needs a policy "
            "and a compression ratio, and no decode budget or streaming window"
        )
    if policy.name in PREFILL_ONLY:
        raise InvalidSettingError(
            f"re-rotation (kvpress's KeyRerotationPress) keeps one count on every layer and "
            f"head: {policy.name}'s own budgets cannot be re-rotated"
        )
    info = model.info
    if info.positions == "learned" or any(info.window(i) is not None for i in range(info.layers)):
        raise InvalidSettingError(
            f"re-rotation needs rotary positions on every layer and no sliding-window layer; "
            f"{info.name} has {info.positions} positions"
            + (" and sliding-window layers" if info.sliding_window is not None else "")
        )


def check_budget(policy: Policy, budget: DecodeBudget) -> None:
    """Refuse a budget the policy cannot keep, before anything runs (kvpress asserts the same mid-run, or scores
    NaN)."""
    if policy.name in PREFILL_ONLY:
        raise InvalidSettingError(
            f"{policy.name} shares a prefill's compression ratio between layers or heads and "
            f"runs after the prefill only here; for a decode budget choose snapkv"
        )
    if policy.name == "expected_attention" and min(budget.interval, HIDDEN_STATES_BUFFER + 1) <= policy.n_sink:
        raise InvalidSettingError(
            f"expected_attention models the queries since the last eviction less the first "
            f"{policy.n_sink} (n_sink): the interval must be larger than that, got "
            f"{budget.interval}"
        )
    if policy.name == "snapkv" and min(budget.interval, HIDDEN_STATES_BUFFER + 1) <= policy.window_size:
        raise InvalidSettingError(
            f"snapkv scores by the last {policy.window_size} queries (window_size): during "
            f"decode the interval must be larger than that, got {budget.interval}"
        )
    if policy.name == "streaming_llm" and budget.target_size <= policy.n_sink:
        raise InvalidSettingError(
            f"streaming_llm keeps {policy.n_sink} sink positions: the budget's target_size must "
            f"be larger, to keep recent ones too; got {budget.target_size}"
        )

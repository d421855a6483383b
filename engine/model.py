"""Our own forward pass, layer by layer, over the loaded weights and the paged KV cache.

Per layer (pre-norm, `DecoderLayer`):  x1 = x0 + attention(norm(x0))   then   x2 = x1 + mlp(norm(x1)).
The second add is onto x1, not x0: a layer adds to the residual stream twice. Gemma 3 also normalises what
each branch adds (four norms a layer): x1 = x0 + norm(attention(norm(x0))), x2 = x1 + norm(mlp(norm(x1))),
and most of its layers attend over a sliding window of the latest positions only.
After the last layer: final norm → lm_head → logits over the vocabulary.
The maths of norm, projections and MLP are in `engine.layers`; what a pass keeps for the trace is
collected by `engine.recorder.StepRecorder`, beside the layers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch

from engine.attention import AttentionResult, attend
from engine.kv_cache import DEFAULT_BLOCK_SIZE, BlockPool, BlockTable
from engine.layers import ROWS_AS_BATCH, linear, mlp, norm, project_qkv
from engine.model_info import ModelInfo
from engine.recorder import ForwardRecord, StepRecorder
from engine.rope import Rope, apply_rope
from engine.trace import Capture
from engine.weights import LayerWeights, Weights

Observer = Callable[[int, AttentionResult, torch.Tensor], None]  # (layer, its attention, its queries before RoPE)
# Called after each layer of every pass this thread runs inside `between_layers`: a server whose pages share one
# interpreter lets other pages' work in during a long pass (a prefill of hundreds of tokens takes seconds).
_BETWEEN_LAYERS: ContextVar[Callable[[], None] | None] = ContextVar("between_layers", default=None)


@contextmanager
def between_layers(pause: Callable[[], None]) -> Iterator[None]:
    """Call `pause()` after each layer of every pass run in this block (in this thread); the passes' numbers do not
    change."""
    token = _BETWEEN_LAYERS.set(pause)
    try:
        yield
    finally:
        _BETWEEN_LAYERS.reset(token)


class Model:
    """A loaded model: its weights, facts, tokenizer and decoder layers; `forward` runs one pass."""

    def __init__(
        self,
        weights: Weights,
        info: ModelInfo,
        tokenizer,
        ropes: dict[str, Rope] | None,
        attention_scales: list[float],
        eos_ids: set[int],
        device: torch.device,
    ):
        self.weights = weights
        self.info = info
        self.tokenizer = tokenizer
        self.ropes = ropes  # by layer kind ("global", "local"); None for learned positions
        self.attention_scales = attention_scales  # per layer (GPT-2 can scale by 1/(layer+1))
        self.eos_ids = eos_ids
        self.device = device
        self.layers = [
            DecoderLayer(i, layer, info, scale, ropes[info.layer_kinds[i]] if ropes else None)
            for i, (layer, scale) in enumerate(zip(weights.layers, attention_scales))
        ]

    @property
    def dtype(self) -> torch.dtype:
        """The weights' dtype, which `info.dtype` names."""
        return self.weights.embed_tokens.dtype

    def new_pool(self, num_blocks: int, block_size: int) -> BlockPool:
        """A KV pool in `info.dtype` (the weights' dtype: see `engine.kv_cache`), so `info.kv_bytes_per_token`
        is what it stores."""
        i = self.info
        return BlockPool(
            i.layers,
            i.kv_heads,
            i.head_dim,
            num_blocks,
            block_size,
            getattr(torch, i.dtype),
            self.device,
            windows=i.layer_windows or None,
        )

    def embed(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rows of the embedding table (an id is only a row number), times √hidden for Gemma, plus GPT-2's
        learned positions."""
        x = self.weights.embed_tokens[ids]
        if self.weights.embed_scale is not None:  # in the weights' dtype, as transformers scales them
            x = x * torch.tensor(self.weights.embed_scale, dtype=x.dtype)
        if self.weights.position_embeddings is not None:
            x = x + self.weights.position_embeddings[positions]
        return x

    def next_input(self, token_id: int, position: int) -> torch.Tensor:
        """(hidden,) on the CPU: what the next step feeds its first layer for `token_id` at `position`:
        the id's embedding row (times √hidden for Gemma), plus the position's row where positions are learned
        (GPT-2: wte + wpe; `info.positions == "learned"`). With RoPE the position enters later, inside attention."""
        ids = torch.tensor([token_id], device=self.device)
        return self.embed(ids, torch.tensor([position], device=self.device))[0].cpu()

    def full_attention(
        self, ids: list[int], layer: int, block_size: int = DEFAULT_BLOCK_SIZE
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's causal attention over the whole sequence `ids`, by one fresh prefill pass.

        Returns probabilities and scores, each (q_heads, n, n). The rows equal what step-by-step decoding
        computed to float precision (~1e-6); this is how a view shows history whose traces were slimmed.
        """
        n = len(ids)
        table = BlockTable(self.new_pool(-(-n // block_size), block_size))
        table.append(n)
        capture = Capture(residuals=False, attention_budget=self.info.q_heads * n * n, layers=(layer,))
        record = self.forward(ids, list(range(n)), table, capture)
        return record.attention[0], record.scores[0]

    def forward(
        self,
        ids: list[int],
        positions: list[int],
        table: BlockTable,
        capture: Capture,
        kv_splits: int = 1,
        write: bool = True,
        kept: list[torch.Tensor | None] | None = None,
        observe: Observer | None = None,
        head: bool = True,
        prefill: bool = False,
        depth: int | None = None,
    ) -> ForwardRecord | torch.Tensor:
        """Process `ids` at `positions`, the last `len(ids)` positions `table` has reserved (`table.append`).

        Each layer writes the new K/V into the pool, then attends over every cached position it can see
        (in `kv_splits` merged splits when > 1). `write=False` writes nothing: the table holds the
        positions before `positions[0]`, and this pass's own K/V are appended to them in memory, so the
        cache is left untouched.
        `kept` (per layer: (kv_heads, positions[-1] + 1) bool, or None) hides what KV eviction dropped from each
        KV head (`engine.eviction`); None reads every cached position. `observe(layer, result, q)` sees each
        layer's attention as it is computed, and its queries before rotation (T, q_heads, D): eviction scores
        from them without a record of every layer's rows.
        `head=False` stops before `lm_head` and returns the final norm's output for every row, (T, hidden): a pass
        that only fills the cache ignores it (`engine.replay`); `logits` turns rows of it into logits.
        `prefill=True` computes the rows as one batch even when a prefix hit leaves one (`layers.ROWS_AS_BATCH`):
        its numbers are then those of the same row in a cold prefill, in every dtype.
        `depth=n` runs the first n layers only, then the final norm (and `lm_head`): the model exiting early, the
        draft of speculative decoding's early exit (`engine.speculative`); the pass writes only those layers' K/V.
        """
        one = Pass(ids, positions, table, capture, kv_splits, write, kept, observe)
        return self.forward_batch([one], head=head, prefill=prefill, depth=depth)[0]

    @torch.inference_mode()
    def forward_batch(
        self, passes: list[Pass], head: bool = True, prefill: bool = False, depth: int | None = None
    ) -> list[ForwardRecord] | list[torch.Tensor]:
        """Several sequences' passes as one: their rows go through every projection and MLP together (the
        weights are read once for the batch, which is what makes a batch cheap when decode is memory-bound),
        while each sequence attends only over its own table's cached K/V, with its own masks. One record (or,
        with `head=False`, one (T, hidden) final norm output) per pass, in order; see `forward`."""
        info = self.info
        ids_t = torch.tensor([i for p in passes for i in p.ids], dtype=torch.long, device=self.device)
        pos_t = torch.tensor([q for p in passes for q in p.positions], dtype=torch.long, device=self.device)
        rope_t = (
            pos_t
            if all(p.rope_positions is None for p in passes)
            else torch.tensor(  # re-rotated passes only
                [q for p in passes for q in (p.rope_positions or p.positions)], dtype=torch.long, device=self.device
            )
        )
        x = self.embed(ids_t, pos_t)  # (rows of every pass, hidden)
        contexts, recorders, start = [], [], 0
        for p in passes:
            rows = slice(start, start + len(p.ids))
            start = rows.stop
            positions = pos_t[rows]
            contexts.append(
                PassContext(
                    rows=rows,
                    positions=positions,
                    cos_sin={kind: rope.cos_sin(rope_t[rows], x.dtype) for kind, rope in self.ropes.items()}
                    if self.ropes
                    else {},
                    kv=PagedKV.of(p.table, p.positions, p.write),
                    local_kv=PagedKV.of(p.table.window, p.positions, p.write) if p.table.window is not None else None,
                    kv_splits=p.kv_splits,
                    kept=p.kept,
                    key_turns=p.key_turns,
                    sink_turns=p.sink_turns,
                    observe=p.observe,
                )
            )
            recorders.append(
                StepRecorder(p.capture, p.positions, info.layers, info.q_heads, info.hidden, x.dtype, self.device)
            )
        token, pause = ROWS_AS_BATCH.set(prefill), _BETWEEN_LAYERS.get()
        try:
            for layer in self.layers[:depth]:
                x = layer(x, contexts, recorders)
                if pause is not None:
                    pause()
        finally:
            ROWS_AS_BATCH.reset(token)
        if not head:  # lm_head's vocab-sized product is most of a decode step's work
            out = norm(x, self.weights.norm)
            return [out[c.rows] for c in contexts]
        if len(passes) == 1:  # one row: lm_head as a matrix-vector product
            final_hidden = norm(x[-1], self.weights.norm)
            return [recorders[0].finish(self.logits(final_hidden), final_hidden)]
        final_hidden = norm(x[[c.rows.stop - 1 for c in contexts]], self.weights.norm)  # (passes, hidden)
        logits = self.logits(final_hidden)
        return [r.finish(logits[i], final_hidden[i]) for i, r in enumerate(recorders)]

    def logits(self, final_hidden: torch.Tensor) -> torch.Tensor:
        """lm_head over the final norm's output: (hidden,) → (vocab,), or (T, hidden) → (T, vocab); float32.
        Gemma 3 caps them (final_logit_softcap), in the weights' dtype, as transformers does."""
        if final_hidden.dim() == 1:  # one row, a decode step: a matrix-vector product
            logits = torch.mv(self.weights.lm_head, final_hidden)
        else:
            logits = torch.nn.functional.linear(final_hidden, self.weights.lm_head)
        cap = self.weights.final_logit_softcap
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits.float()


@dataclass
class Pass:
    """One sequence's part of a (batched) forward pass: `Model.forward`'s arguments, less the batch's own."""

    ids: list[int]
    positions: list[int]
    table: BlockTable
    capture: Capture
    kv_splits: int = 1
    write: bool = True
    kept: list[torch.Tensor | None] | None = None
    observe: Observer | None = None
    # Re-rotated positions (kvpress's KeyRerotationPress): the positions the rows' q and k turn by, where they are
    # not `positions` (the cache slots they take and the causal mask's order), and per layer (kv_heads, n) the
    # turn of each of the first n cached keys as read (None: as written).
    rope_positions: list[int] | None = None
    key_turns: list[torch.Tensor | None] | None = None
    # StreamingLLM's positions inside the cache over a teacher-forced pass (`engine.eviction.nll`): the first s keys
    # (the sinks) read by each row turned on by its own turn (T,), on the layers that evict (`kept` not None).
    sink_turns: tuple[int, torch.Tensor] | None = None


@dataclass
class PagedKV:
    """One table's K/V in the pool as a pass sees it: its blocks, and where this pass's K/V go."""

    pool: BlockPool
    blocks: torch.Tensor  # (logical blocks held,) physical block of each
    slots: torch.Tensor | None  # (T,) flat slots for this pass's K/V; None: write nothing
    first_block: int | None  # the first block when the blocks are consecutive (read as a view)
    start: int  # the first position the blocks hold (past 0 once a sliding window handed blocks back)
    cached: int  # positions before this pass
    length: int  # positions attended: cached + T

    @classmethod
    def of(cls, table: BlockTable, positions: list[int], write: bool) -> PagedKV:
        return cls(
            table.pool,
            table.device_blocks(),
            table.slots_at(positions) if write else None,
            table.first_of_run(),
            table.first_position,
            positions[0],
            positions[-1] + 1,
        )

    def store_and_read(self, row: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this pass's k, v (T, kv_heads, D) for the pool's layer `row`; return K, V of positions
        `start` … length − 1 (L − start, kv_heads, D). Without slots, the cached positions are read and k, v
        appended in memory: the values a write then a read would give, with nothing written."""
        if self.slots is None:
            cached_k, cached_v = self.pool.read(row, self.blocks, self.cached - self.start, self.first_block)
            return torch.cat((cached_k, k)), torch.cat((cached_v, v))
        self.pool.write(row, self.slots, k, v)
        return self.pool.read(row, self.blocks, self.length - self.start, self.first_block)


@dataclass
class PassContext:
    """What every layer of a forward pass shares for one of its sequences."""

    rows: slice  # this sequence's rows of the batch
    positions: torch.Tensor  # (T,) the query positions
    cos_sin: dict[str, tuple[torch.Tensor, torch.Tensor]]  # RoPE's (T, head_dim) each, per layer kind; {} if learned
    kv: PagedKV  # the global layers' cache
    local_kv: PagedKV | None  # the sliding-window layers' cache
    kv_splits: int
    kept: list[torch.Tensor | None] | None = None  # per layer, what eviction left each KV head (None: all)
    key_turns: list[torch.Tensor | None] | None = None  # per layer, the cached keys' turns as read (`Pass`)
    sink_turns: tuple[int, torch.Tensor] | None = None  # (s, (T,)): each row's turn of the first s keys (`Pass`)
    observe: Observer | None = None  # sees each layer's attention result


class DecoderLayer:
    """One pre-norm decoder layer: attention, then the MLP, each added onto the residual stream."""

    def __init__(
        self, index: int, weights: LayerWeights, info: ModelInfo, attention_scale: float, rope: Rope | None = None
    ):
        self.index = index
        self.rope = rope  # its kind's RoPE; None for learned positions
        self.w = weights
        self.q_heads, self.kv_heads, self.head_dim = info.q_heads, info.kv_heads, info.head_dim
        self.scale = attention_scale
        self.window = info.window(index)  # None: a global layer
        self.kind = info.layer_kinds[index]

    def __call__(self, x0: torch.Tensor, contexts: list[PassContext], recorders: list[StepRecorder]) -> torch.Tensor:
        """x0 (T, hidden) → x2 (T, hidden), T the rows of every sequence. The second add is onto x1, not x0."""
        x1 = x0 + self.output_norm(
            self.attention(norm(x0, self.w.input_layernorm), contexts, recorders), self.w.attention_output_norm
        )
        x2 = x1 + self.output_norm(mlp(norm(x1, self.w.post_attention_layernorm), self.w), self.w.mlp_output_norm)
        for context, recorder in zip(contexts, recorders):
            rows = context.rows
            recorder.residuals(self.index, x0[rows], x1[rows], x2[rows])
        return x2

    @staticmethod
    def output_norm(branch: torch.Tensor, n) -> torch.Tensor:
        """What a branch adds to the stream: its output, normalised first where the layer has that norm (Gemma)."""
        return branch if n is None else norm(branch, n)

    def attention(self, h: torch.Tensor, contexts: list[PassContext], recorders: list[StepRecorder]) -> torch.Tensor:
        """h (T, hidden), normalised → o_proj of the concatenated head outputs (T, hidden).

        Project q, k, v (every sequence's rows at once); normalise q and k per head (Qwen3, Gemma); then per
        sequence: rotate them by position (RoPE, with the layer kind's base); write k, v to its paged table and
        read back the cached positions this layer keeps; attend over them (within the window for a local layer;
        in merged splits when asked).
        """
        t = h.shape[0]
        q, k, v = project_qkv(h, self.w)
        q = q.reshape(t, self.q_heads, self.head_dim)  # (T, q_heads, D)
        k = k.reshape(t, self.kv_heads, self.head_dim)  # (T, kv_heads, D)
        v = v.reshape(t, self.kv_heads, self.head_dim)
        if self.w.q_norm is not None:
            q, k = norm(q, self.w.q_norm), norm(k, self.w.k_norm)
        outputs = [self.attend_one(q[c.rows], k[c.rows], v[c.rows], c, r) for c, r in zip(contexts, recorders)]
        return linear(outputs[0] if len(outputs) == 1 else torch.cat(outputs), self.w.o_proj)

    def attend_one(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context: PassContext, recorder: StepRecorder
    ) -> torch.Tensor:
        """One sequence's rows: q (T, q_heads, D), k and v (T, kv_heads, D) → the head outputs (T, q_heads × D)."""
        unrotated_q = q
        if context.cos_sin:
            cos_sin = context.cos_sin[self.kind]
            q, k = apply_rope(q, *cos_sin), apply_rope(k, *cos_sin)
        local, row = context.kv.pool.rows[self.index]  # the pool of this layer's kind, and its row there
        kv = context.local_kv if local else context.kv
        cached_k, cached_v = kv.store_and_read(row, k, v)  # (L − start, kv_heads, D)
        turns = context.key_turns[self.index] if context.key_turns is not None else None
        if turns is not None:
            cached_k = self.rope.turned(cached_k, turns)
        kept = context.kept[self.index] if context.kept is not None else None
        sink_queries = None
        if context.sink_turns is not None and kept is not None:
            sinks, sink_turns = context.sink_turns
            sink_queries = (sinks, self.rope.turned(q, -sink_turns.expand(q.shape[1], -1)))
        result = attend(
            q,
            cached_k,
            cached_v,
            context.positions,
            self.scale,
            context.kv_splits,
            self.window,
            kv.start,
            kept,
            sink_queries,
        )
        recorder.attention(self.index, result)
        if context.observe is not None:
            context.observe(self.index, result, unrotated_q)
        return result.output

"""Our own forward pass, layer by layer, over the loaded weights and the paged KV cache.

Each layer is a pre-norm `DecoderLayer` (`engine.decoder_layer`), over the rows of every sequence the pass holds
(`engine.passes`). After the last layer: final norm → lm_head → logits over the vocabulary.
The maths of norm, projections and MLP are in `engine.layers`; what a pass keeps for the trace is
collected by `engine.recorder.StepRecorder`, beside the layers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from engine.decoder_layer import DecoderLayer
from engine.kv_cache import DEFAULT_BLOCK_SIZE, BlockPool, BlockTable
from engine.layers import ROWS_AS_BATCH, norm
from engine.model_info import ModelInfo
from engine.passes import Observer, PagedKV, Pass, PassContext
from engine.recorder import ForwardRecord, StepRecorder
from engine.rope import Rope
from engine.trace import Capture
from engine.weights import Weights

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

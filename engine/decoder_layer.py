"""One pre-norm decoder layer over the rows of every sequence in a pass:  x1 = x0 + attention(norm(x0))   then
x2 = x1 + mlp(norm(x1)). The second add is onto x1, not x0: a layer adds to the residual stream twice. Gemma 3 also
normalises what each branch adds (four norms a layer): x1 = x0 + norm(attention(norm(x0))),
x2 = x1 + norm(mlp(norm(x1))), and most of its layers attend over a sliding window of the latest positions only.
"""

from __future__ import annotations

import torch

from engine.attention import attend
from engine.layers import linear, mlp, norm, project_qkv
from engine.model_info import ModelInfo
from engine.passes import PassContext
from engine.recorder import StepRecorder
from engine.rope import Rope, apply_rope
from engine.weights import LayerWeights


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

"""Our own forward pass, layer by layer, over the loaded weights and the paged KV cache.

Per layer (pre-norm, `DecoderLayer`):  x1 = x0 + attention(norm(x0))   then   x2 = x1 + mlp(norm(x1)).
The second add is onto x1, not x0: a layer adds to the residual stream twice.
After the last layer: final norm → lm_head → logits over the vocabulary.
The maths of norm, projections and MLP are in `engine.layers`; what a pass keeps for the trace is
collected by `engine.recorder.StepRecorder`, beside the layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention import attend
from engine.kv_cache import BlockPool, kv_bytes_per_token
from engine.layers import linear, mlp, norm, project_qkv
from engine.recorder import ForwardRecord, StepRecorder
from engine.rope import Rope, apply_rope
from engine.trace import Capture
from engine.weights import LayerWeights, Weights


ATTENTION_COPIES = 6  # (q_heads, T, L) float32 tensors one layer's attention holds at its peak


@dataclass(frozen=True)
class ModelInfo:
    """The facts the model card shows."""

    name: str
    family: str  # "llama", "qwen2", "qwen3" or "gpt2"
    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    context_limit: int
    dtype: str
    parameters: int
    norm: str  # "RMSNorm" or "LayerNorm"
    positions: str  # "RoPE (<type>)" or "learned"

    @property
    def element_bytes(self) -> int:
        """Bytes per number of the weights and of the KV cache, which keeps the weights' dtype (`dtype`;
        4 for float32, 2 for bfloat16): `Model.new_pool` allocates exactly this."""
        return torch.finfo(getattr(torch, self.dtype)).bits // 8

    @property
    def kv_bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.layers, self.kv_heads, self.head_dim, self.element_bytes)

    @property
    def gqa_group(self) -> int:
        """How many Q heads share one KV head."""
        return self.q_heads // self.kv_heads

    def attention_bytes(self, rows: int, length: int) -> int:
        """Peak bytes one layer's attention allocates for `rows` queries over `length` keys: scores, the
        mask, probabilities and softmax's own work, ATTENTION_COPIES tensors of (q_heads, rows, length)
        float32. Split-KV adds a bounded amount whatever the split count (merged as it goes, a group of
        at most SPLIT_GROUP_ELEMENTS at a time; tests/test_memory_bounds.py bounds it by 16 MiB)."""
        return ATTENTION_COPIES * self.q_heads * rows * length * 4

    def split_record_bytes(self, splits: int) -> int:
        """Bytes one step's split-KV record holds: m_i, l_i, w_i and O_i per layer, Q head and split."""
        return self.layers * self.q_heads * splits * (self.head_dim + 3) * 4


class Model:
    """A loaded model: its weights, facts, tokenizer and decoder layers; `forward` runs one pass."""

    def __init__(self, weights: Weights, info: ModelInfo, tokenizer, rope: Rope | None, attention_scales: list[float],
                 eos_ids: set[int], device: torch.device):
        self.weights = weights
        self.info = info
        self.tokenizer = tokenizer
        self.rope = rope
        self.attention_scales = attention_scales  # per layer (GPT-2 can scale by 1/(layer+1))
        self.eos_ids = eos_ids
        self.device = device
        self.layers = [DecoderLayer(i, layer, info, scale)
                       for i, (layer, scale) in enumerate(zip(weights.layers, attention_scales))]

    @property
    def dtype(self) -> torch.dtype:
        """The weights' dtype, which `info.dtype` names."""
        return self.weights.embed_tokens.dtype

    def new_pool(self, num_blocks: int, block_size: int) -> BlockPool:
        """A KV pool in `info.dtype` (the weights' dtype: see `engine.kv_cache`), so `info.kv_bytes_per_token`
        is what it stores."""
        i = self.info
        return BlockPool(i.layers, i.kv_heads, i.head_dim, num_blocks, block_size, getattr(torch, i.dtype), self.device)

    def embed(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rows of the embedding table (an id is only a row number), plus GPT-2's learned positions."""
        x = self.weights.embed_tokens[ids]
        if self.weights.position_embeddings is not None:
            x = x + self.weights.position_embeddings[positions]
        return x

    def next_input(self, token_id: int, position: int) -> torch.Tensor:
        """(hidden,) on the CPU: what the next step feeds its first layer for `token_id` at `position`:
        the id's embedding row, plus the position's row where positions are learned (GPT-2: wte + wpe;
        `info.positions == "learned"`). With RoPE the position enters later, inside attention."""
        ids = torch.tensor([token_id], device=self.device)
        return self.embed(ids, torch.tensor([position], device=self.device))[0].cpu()

    def full_attention(self, ids: list[int], layer: int, block_size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's causal attention over the whole sequence `ids`, by one fresh prefill pass.

        Returns probabilities and scores, each (q_heads, n, n). The rows equal what step-by-step decoding
        computed to float precision (~1e-6); this is how a view shows history whose traces were slimmed.
        """
        n = len(ids)
        pool = self.new_pool(-(-n // block_size), block_size)
        blocks = torch.arange(pool.num_blocks, device=self.device)
        capture = Capture(residuals=False, attention_budget=self.info.q_heads * n * n, layers=(layer,))
        record = self.forward(ids, list(range(n)), pool, blocks, torch.arange(n, device=self.device), capture,
                              first_block=0)
        return record.attention[0], record.scores[0]

    @torch.inference_mode()
    def forward(self, ids: list[int], positions: list[int], pool: BlockPool, blocks: torch.Tensor,
                slots: torch.Tensor | None, capture: Capture, kv_splits: int = 1, first_block: int | None = None
                ) -> ForwardRecord:
        """Process `ids` at `positions` (the next ones after what `blocks` already holds; `first_block`
        when those blocks are consecutive, see `BlockPool.read`).

        `slots=None` reads without writing: the pool already holds the positions before `positions[0]`,
        and this pass's own K/V are appended to them in memory, so the cache is left untouched.

        Each layer writes the new K/V into the pool at `slots`, then attends over every cached position
        (in `kv_splits` merged splits when > 1).
        """
        info = self.info
        ids_t = torch.tensor(ids, dtype=torch.long, device=self.device)
        pos_t = torch.tensor(positions, dtype=torch.long, device=self.device)
        x = self.embed(ids_t, pos_t)  # (T, hidden)
        context = PassContext(
            positions=pos_t,
            cos_sin=self.rope.cos_sin(pos_t, x.dtype) if self.rope else None,
            kv=PagedKV(pool, blocks, slots, first_block, cached=positions[0], length=positions[-1] + 1),
            kv_splits=kv_splits,
        )
        recorder = StepRecorder(capture, positions, info.layers, info.q_heads, info.hidden, x.dtype, self.device)
        for layer in self.layers:
            x = layer(x, context, recorder)
        final_hidden = norm(x[-1], self.weights.norm)
        logits = torch.mv(self.weights.lm_head, final_hidden).float()
        return recorder.finish(logits, final_hidden)


@dataclass
class PagedKV:
    """One sequence's K/V in the pool as a pass sees it: its blocks, and where this pass's K/V go."""

    pool: BlockPool
    blocks: torch.Tensor  # (logical blocks,) physical block of each
    slots: torch.Tensor | None  # (T,) flat slots for this pass's K/V; None: write nothing
    first_block: int | None  # the first block when the blocks are consecutive (read as a view)
    cached: int  # positions the blocks held before this pass
    length: int  # positions attended: cached + T

    def store_and_read(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this pass's k, v (T, kv_heads, D) for `layer`; return K, V of all `length` positions
        (L, kv_heads, D). Without slots, the cached positions are read and k, v appended in memory: the
        values a write then a read would give, with nothing written."""
        if self.slots is None:
            cached_k, cached_v = self.pool.read(layer, self.blocks, self.cached, self.first_block)
            return torch.cat((cached_k, k)), torch.cat((cached_v, v))
        self.pool.write(layer, self.slots, k, v)
        return self.pool.read(layer, self.blocks, self.length, self.first_block)


@dataclass
class PassContext:
    """What every layer of one forward pass shares."""

    positions: torch.Tensor  # (T,) the query positions
    cos_sin: tuple[torch.Tensor, torch.Tensor] | None  # RoPE's (T, head_dim) each; None for learned positions
    kv: PagedKV
    kv_splits: int


class DecoderLayer:
    """One pre-norm decoder layer: attention, then the MLP, each added onto the residual stream."""

    def __init__(self, index: int, weights: LayerWeights, info: ModelInfo, attention_scale: float):
        self.index = index
        self.w = weights
        self.q_heads, self.kv_heads, self.head_dim = info.q_heads, info.kv_heads, info.head_dim
        self.scale = attention_scale

    def __call__(self, x0: torch.Tensor, context: PassContext, recorder: StepRecorder) -> torch.Tensor:
        """x0 (T, hidden) → x2 (T, hidden). The second add is onto x1, not x0."""
        x1 = x0 + self.attention(norm(x0, self.w.input_layernorm), context, recorder)
        x2 = x1 + mlp(norm(x1, self.w.post_attention_layernorm), self.w)
        recorder.residuals(self.index, x0, x1, x2)
        return x2

    def attention(self, h: torch.Tensor, context: PassContext, recorder: StepRecorder) -> torch.Tensor:
        """h (T, hidden), normalised → o_proj of the concatenated head outputs (T, hidden).

        Project q, k, v; normalise q and k per head (Qwen3); rotate them by position (RoPE); write k, v
        to the paged pool and read back every cached position; attend (in merged splits when asked).
        """
        t = h.shape[0]
        q, k, v = project_qkv(h, self.w)
        q = q.reshape(t, self.q_heads, self.head_dim)  # (T, q_heads, D)
        k = k.reshape(t, self.kv_heads, self.head_dim)  # (T, kv_heads, D)
        v = v.reshape(t, self.kv_heads, self.head_dim)
        if self.w.q_norm is not None:
            q, k = norm(q, self.w.q_norm), norm(k, self.w.k_norm)
        if context.cos_sin is not None:
            q, k = apply_rope(q, *context.cos_sin), apply_rope(k, *context.cos_sin)
        cached_k, cached_v = context.kv.store_and_read(self.index, k, v)  # (L, kv_heads, D)
        result = attend(q, cached_k, cached_v, context.positions, self.scale, context.kv_splits)
        recorder.attention(self.index, result)
        return linear(result.output, self.w.o_proj)

"""Our own forward pass, layer by layer, over the loaded weights and the paged KV cache.

Per layer (pre-norm):  x1 = x0 + o_proj(attention(norm(x0)))   then   x2 = x1 + mlp(norm(x1)).
The second add is onto x1, not x0: a layer adds to the residual stream twice.
After the last layer: final norm → lm_head → logits over the vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention import attend
from engine.kv_cache import BlockPool, kv_bytes_per_token
from engine.rope import Rope, apply_rope
from engine.trace import Capture, SplitKVTrace
from engine.weights import Weights


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
        """Bytes per number of the weights and the KV cache (4 for float32)."""
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


@dataclass
class ForwardRecord:
    """What one forward pass returns: logits for the last position and what `Capture` asked for."""

    logits: torch.Tensor  # (vocab,) float32
    final_hidden: torch.Tensor  # (hidden,) after the final norm
    attention: torch.Tensor | None  # (layers, q_heads, rows, L)
    scores: torch.Tensor | None
    attention_rows: list[int]
    residual: torch.Tensor | None  # (layers, 3, hidden) at the last position
    split: SplitKVTrace | None


class Model:
    def __init__(self, weights: Weights, info: ModelInfo, tokenizer, rope: Rope | None, attention_scales: list[float],
                 eos_ids: set[int], device: torch.device):
        self.weights = weights
        self.info = info
        self.tokenizer = tokenizer
        self.rope = rope
        self.attention_scales = attention_scales  # per layer (GPT-2 can scale by 1/(layer+1))
        self.eos_ids = eos_ids
        self.device = device

    @property
    def dtype(self) -> torch.dtype:
        return self.weights.embed_tokens.dtype

    def new_pool(self, num_blocks: int, block_size: int) -> BlockPool:
        i = self.info
        return BlockPool(i.layers, i.kv_heads, i.head_dim, num_blocks, block_size, self.dtype, self.device)

    def embed(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rows of the embedding table (an id is only a row number), plus GPT-2's learned positions."""
        x = self.weights.embed_tokens[ids]
        if self.weights.position_embeddings is not None:
            x = x + self.weights.position_embeddings[positions]
        return x

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
        w, info = self.weights, self.info
        ids_t = torch.tensor(ids, dtype=torch.long, device=self.device)
        pos_t = torch.tensor(positions, dtype=torch.long, device=self.device)
        t, length = len(ids), positions[-1] + 1
        rows = _attention_rows(t, length, info, capture)
        recorded = list(range(info.layers) if capture.layers is None else capture.layers)
        slot_of = {layer: i for i, layer in enumerate(recorded)} if capture.attention else {}
        x = self.embed(ids_t, pos_t)
        cos_sin = self.rope.cos_sin(pos_t, x.dtype) if self.rope else None
        # Filled layer by layer: one copy per layer into buffers sized for what is kept.
        probs_out = torch.empty((len(slot_of), info.q_heads, rows, length), dtype=x.dtype, device=self.device)
        scores_out = torch.empty_like(probs_out)
        residual = torch.empty((info.layers, 3, info.hidden), dtype=x.dtype, device=self.device) \
            if capture.residuals else None
        splits = []
        for index, layer in enumerate(w.layers):
            x0 = x
            h = layer.input_layernorm(x0)
            q, k, v = layer.project_qkv(h)  # one matmul for q_proj, k_proj, v_proj
            q = q.reshape(t, info.q_heads, info.head_dim)
            k = k.reshape(t, info.kv_heads, info.head_dim)
            v = v.reshape(t, info.kv_heads, info.head_dim)
            if layer.q_norm is not None:
                q, k = layer.q_norm(q), layer.k_norm(k)
            if cos_sin is not None:
                q, k = apply_rope(q, *cos_sin), apply_rope(k, *cos_sin)
            if slots is None:
                cached_k, cached_v = _cached_then_new(pool, index, blocks, positions[0], first_block, k, v)
            else:
                pool.write(index, slots, k, v)
                cached_k, cached_v = pool.read(index, blocks, length, first_block)
            result = attend(q, cached_k, cached_v, pos_t, self.attention_scales[index], kv_splits)
            x1 = x0 + layer.o_proj(result.output)
            x = x1 + layer.mlp(layer.post_attention_layernorm(x1))
            if index in slot_of:
                probs_out[slot_of[index]] = result.probs[:, -rows:]
                scores_out[slot_of[index]] = result.scores[:, -rows:]
            if residual is not None:
                torch.stack((x0[-1], x1[-1], x[-1]), out=residual[index])
            if result.split is not None:
                splits.append(result.split)
        final_hidden = w.norm(x[-1])
        logits = torch.mv(w.lm_head, final_hidden).float()
        return ForwardRecord(
            logits=logits.cpu(),
            final_hidden=final_hidden.cpu(),
            attention=probs_out.cpu() if slot_of else None,
            scores=scores_out.cpu() if slot_of else None,
            attention_rows=positions[-rows:] if slot_of else [],
            residual=residual.cpu() if residual is not None else None,
            split=_stack_splits(splits) if splits else None,
        )


def _cached_then_new(pool: BlockPool, layer: int, blocks: torch.Tensor, cached: int, first_block: int | None,
                     k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The first `cached` positions' K/V from the pool followed by k, v (T, kv_heads, head_dim) of this
    pass: the same values a write then a read would give, with nothing written."""
    cached_k, cached_v = pool.read(layer, blocks, cached, first_block)
    return torch.cat((cached_k, k)), torch.cat((cached_v, v))


def _stack_splits(records) -> SplitKVTrace:
    def stack(get):
        return torch.stack([get(r) for r in records]).cpu()

    return SplitKVTrace(
        ranges=records[0].ranges,
        max_score=stack(lambda r: r.partials.max_score),
        exp_sum=stack(lambda r: r.partials.exp_sum),
        partial=stack(lambda r: r.partials.output),
        weight=stack(lambda r: r.merged.weight),
        merged=stack(lambda r: r.merged.output),
        unsplit=stack(lambda r: r.unsplit),
    )


def _attention_rows(t: int, length: int, info: ModelInfo, capture: Capture) -> int:
    """How many of the last query rows fit in the capture budget (at least one)."""
    layers = info.layers if capture.layers is None else len(capture.layers)
    per_row = max(1, layers) * info.q_heads * length
    return max(1, min(t, capture.attention_budget // per_row))

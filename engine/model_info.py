"""What the engine knows of a model besides its weights: its shape, its dtype, its limits, and the bytes its K/V,
attention and split-KV records take (the costs the views and the host's limits are computed from)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.kv_cache import kv_bytes_per_token

ATTENTION_COPIES = 6  # (q_heads, T, L) float32 tensors one layer's attention holds at its peak


@dataclass(frozen=True)
class ModelInfo:
    """The facts the model card shows."""

    name: str
    family: str  # "llama", "qwen2", "qwen3", "gpt2" or "gemma3_text"
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
    # Per layer: its sliding window (Gemma 3's local layers), or None where it attends over everything;
    # empty when every layer is global.
    layer_windows: tuple[int | None, ...] = ()
    # The norms every layer has, in the order the layer applies them, named as transformers names them.
    layer_norms: tuple[str, ...] = ("input_layernorm", "post_attention_layernorm")

    def window(self, layer: int) -> int | None:
        """Layer `layer`'s sliding window, None for a global layer."""
        return self.layer_windows[layer] if self.layer_windows else None

    @property
    def layer_kinds(self) -> tuple[str, ...]:
        """ "local" (sliding window) or "global" for every layer."""
        return tuple("global" if self.window(i) is None else "local" for i in range(self.layers))

    @property
    def sliding_window(self) -> int | None:
        """The local layers' window, None when there are none."""
        return next((w for w in self.layer_windows if w is not None), None)

    def cached_positions(self, layer: int, length: int) -> int:
        """Positions layer `layer` keeps for a sequence of `length`: all of them, or at most its window (the
        cache holds them in whole blocks, so up to a block more sits in memory until the window passes it)."""
        window = self.window(layer)
        return length if window is None else min(length, window)

    def kv_bytes(self, length: int) -> int:
        """Bytes the K/V of a `length`-position sequence take: every layer's cached positions × 2 × kv_heads
        × head_dim × bytes per element. Equals length × kv_bytes_per_token when every layer is global."""
        per_position = kv_bytes_per_token(1, self.kv_heads, self.head_dim, self.element_bytes)
        return per_position * sum(self.cached_positions(i, length) for i in range(self.layers))

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

"""The computations inside one decoder layer, as plain functions over the weights in `engine.weights`.

Norm (RMSNorm or LayerNorm), the linear projections, the q/k/v projection and the MLP. The layer that
strings them together is `engine.decoder_layer.DecoderLayer`; attention itself is `engine.attention.attend`.
"""

from __future__ import annotations

from contextvars import ContextVar

import torch
import torch.nn.functional as F

from engine.weights import LayerWeights, Linear, Norm

# True during a prefill's pass (`Model.forward(prefill=True)`): a single row is multiplied as a batch of two. On CPUs
# with native bfloat16 dot products (AVX512-BF16) a one-row product takes another kernel than a many-row one and
# rounds differently, so the last prompt row that a prefix hit leaves would differ from the same row in a cold
# prefill, and a warm run would part from its own link's cold run (tests/test_embedded_bf16.py).
ROWS_AS_BATCH: ContextVar[bool] = ContextVar("rows_as_batch", default=False)


def linear(x: torch.Tensor, p: Linear) -> torch.Tensor:
    """x (T, in) → (T, out): x · weightᵀ + bias."""
    if x.shape[0] == 1 and ROWS_AS_BATCH.get():
        return F.linear(x.repeat(2, 1), p.weight, p.bias)[:1]
    return F.linear(x, p.weight, p.bias)


def norm(x: torch.Tensor, n: Norm) -> torch.Tensor:
    """RMSNorm (Llama, Qwen; Gemma's with 1 + weight) or LayerNorm (GPT-2) over the last axis of x (..., width)."""
    if n.kind == "layer":
        return F.layer_norm(x, (x.shape[-1],), n.weight, n.bias, n.eps)
    if x.dtype == torch.float32 and n.weight.dtype == torch.float32 and not n.offset:
        return F.rms_norm(x, (x.shape[-1],), n.weight, n.eps)  # one fused kernel
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + n.eps)
    if n.offset:  # Gemma, as transformers does: scaled by (1 + weight) in float32, then cast
        return (x32 * (n.offset + n.weight.float())).to(x.dtype)
    return n.weight * x32.to(x.dtype)  # as transformers does: normalise in float32, scale in the weight's dtype


def project_qkv(h: torch.Tensor, w: LayerWeights) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """h (T, hidden) → q (T, q_heads × D), k and v (T, kv_heads × D): one matmul over the stacked weight."""
    sizes = [w.q_proj.weight.shape[0], w.k_proj.weight.shape[0], w.v_proj.weight.shape[0]]
    return linear(h, w.qkv).split(sizes, dim=-1)


def mlp(x: torch.Tensor, w: LayerWeights) -> torch.Tensor:
    """x (T, hidden) → (T, hidden): down(act(gate(x)) · up(x)), or GPT-2's plain down(act(up(x)))."""
    if w.gate_up is None:
        return linear(w.act(linear(x, w.up_proj)), w.down_proj)
    gate, up = linear(x, w.gate_up).chunk(2, dim=-1)
    return linear(w.act(gate) * up, w.down_proj)

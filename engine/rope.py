"""Rotary position embedding (RoPE): the position enters q and k by rotation, not the embedding table.

The frequencies come from transformers' own rotary module for the model (so llama3, linear and yarn
scaling are exactly theirs); the rotation itself is the usual `rotate_half` form. Gemma 3 has one
rotary module with a set of frequencies per layer type: its sliding-window layers turn with base 10,000,
its global layers with base 1,000,000 (and any scaling), so a model holds one `Rope` per layer type.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.errors import UnsupportedModelError

# These types change their frequencies with the sequence length; the engine does not model that.
LENGTH_DEPENDENT_ROPE_TYPES = {"dynamic", "longrope"}


@dataclass
class Rope:
    inv_freq: torch.Tensor  # (head_dim / 2,) float32
    attention_scaling: float
    rope_type: str

    @classmethod
    def from_hf(cls, rotary_module, layer_type: str | None = None) -> Rope:
        """From transformers' rotary module; `layer_type` picks one of a per-type module's sets (Gemma 3)."""
        if layer_type is None:
            rope_type = getattr(rotary_module, "rope_type", "default")
            inv_freq, scaling = rotary_module.inv_freq, rotary_module.attention_scaling
        else:
            rope_type = rotary_module.rope_type[layer_type]
            inv_freq = getattr(rotary_module, f"{layer_type}_inv_freq")
            scaling = getattr(rotary_module, f"{layer_type}_attention_scaling")
        if rope_type in LENGTH_DEPENDENT_ROPE_TYPES:
            raise UnsupportedModelError(
                f"RoPE type {rope_type!r} depends on the sequence length and is not supported; "
                "supported: default, linear, llama3, yarn"
            )
        return cls(inv_freq.detach().float().clone(), float(scaling), rope_type)

    @property
    def base(self) -> float:
        """The base θ the frequencies come from (exact for unscaled RoPE): inv_freq[1] = θ^(−2/head_dim)."""
        dim = 2 * self.inv_freq.shape[0]
        return float(self.inv_freq[1].double() ** (-dim / 2)) if dim > 2 else float("nan")

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of shape (T, head_dim) for integer positions (T,)."""
        freqs = positions.float()[:, None] * self.inv_freq.to(positions.device)[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        return (angles.cos() * self.attention_scaling).to(dtype), (angles.sin() * self.attention_scaling).to(dtype)

    def turned(self, k: torch.Tensor, turns: torch.Tensor) -> torch.Tensor:
        """Cached keys k (L, kv_heads, head_dim), each already rotated at its own position, turned on by
        `turns` (kv_heads, n ≤ L) more positions (0 past n): the rotation composes, R(p + d) = R(d)·R(p), so a kept
        key moves to another position without being recomputed. As kvpress's KeyRerotationPress turns them: its
        angles in float32, without `attention_scaling` (the key carries it already)."""
        angles = turns.T.float()[..., None] * self.inv_freq.to(k.device)  # (n, kv_heads, head_dim / 2)
        angles = torch.cat((angles, angles), dim=-1)
        head = k[: turns.shape[1]]
        turned = head * angles.cos().to(k.dtype) + rotate_half(head) * angles.sin().to(k.dtype)
        return torch.cat((turned, k[turns.shape[1] :]))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) → (−x2, x1) over the last axis's halves: the rotation's sine part."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (T, heads, head_dim) by its positions' angles; cos/sin are (T, head_dim)."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]

"""The model's weights as plain tensors, named as in Hugging Face transformers' Llama/Qwen files.

We take the tensors out of a transformers model once, then run our own forward pass over them
(`engine.model`, with the maths in `engine.layers`); this module only loads and holds them. GPT-2's
fused `c_attn` (a Conv1D, stored input × output) is split into q/k/v and transposed so every family
goes through the same code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.activations import ACT2FN

from engine.errors import UnsupportedModelError
from engine.pages import drop_file_pages


@dataclass
class Linear:
    weight: torch.Tensor  # (out, in)
    bias: torch.Tensor | None = None


@dataclass
class Norm:
    """RMSNorm (Llama, Qwen) when `kind == "rms"` (no bias), LayerNorm (GPT-2) when `kind == "layer"`.

    Gemma's RMSNorm scales by (1 + weight) (its weights are stored around 0): `offset` 1.0."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    eps: float
    kind: str  # "rms" or "layer"
    offset: float = 0.0


@dataclass
class LayerWeights:
    input_layernorm: Norm
    q_proj: Linear
    k_proj: Linear
    v_proj: Linear
    o_proj: Linear
    q_norm: Norm | None  # Qwen3 only: RMSNorm over each head's 128 dims, before RoPE
    k_norm: Norm | None
    post_attention_layernorm: Norm
    gate_proj: Linear | None  # gated MLP (Llama, Qwen); None for GPT-2's plain MLP
    up_proj: Linear  # GPT-2: c_fc
    down_proj: Linear  # GPT-2: mlp.c_proj
    act: object  # the activation function (silu, gelu_new, gelu_pytorch_tanh for Gemma's GeGLU, ...)
    # Gemma 3's "sandwich": a norm on attention's output and one on the MLP's output, before each add
    # (transformers' post_attention_layernorm and post_feedforward_layernorm; its pre_feedforward_layernorm
    # is our `post_attention_layernorm`, the norm in front of the MLP as in every family).
    attention_output_norm: Norm | None = None
    mlp_output_norm: Norm | None = None
    qkv: Linear | None = None  # q_proj, k_proj, v_proj stacked: one matmul instead of three
    gate_up: Linear | None = None  # gate_proj and up_proj stacked

    def fuse(self) -> None:
        """Stack q/k/v (and gate/up) into one weight each; the named projections become views of it.

        The parts' own memory is given up as each is stacked (see `_stack`), so loading holds at most
        one layer's parts twice, never a second copy of the model."""
        self.qkv = _stack(self.q_proj, self.k_proj, self.v_proj)
        if self.gate_proj is not None:
            self.gate_up = _stack(self.gate_proj, self.up_proj)


def _stack(*parts: Linear) -> Linear:
    """One Linear whose output is the parts' outputs side by side; each part is re-pointed at its slice.

    Parts read from a mapped weights file give their pages back once copied (`engine.pages`); parts in
    ordinary memory are freed when their last holder (the transformers module) lets go of them.
    """
    originals = [t for p in parts for t in (p.weight, p.bias) if t is not None]
    weight = torch.cat([p.weight for p in parts])
    has_bias = any(p.bias is not None for p in parts)
    bias = (
        torch.cat([p.bias if p.bias is not None else weight.new_zeros(p.weight.shape[0]) for p in parts])
        if has_bias
        else None
    )
    start = 0
    for p in parts:
        rows = p.weight.shape[0]
        p.weight = weight[start : start + rows]
        if p.bias is not None:
            p.bias = bias[start : start + rows]
        start += rows
    drop_file_pages(originals)
    return Linear(weight, bias)


@dataclass
class Weights:
    embed_tokens: torch.Tensor  # (vocab, hidden): one row per token id
    position_embeddings: torch.Tensor | None  # (context, hidden), GPT-2's learned positions
    layers: list[LayerWeights]
    norm: Norm  # final norm before lm_head
    lm_head: torch.Tensor  # (vocab, hidden); the same tensor as embed_tokens when tied
    tied: bool
    embed_scale: float | None = None  # Gemma: rows are multiplied by √hidden (in the weights' dtype)
    final_logit_softcap: float | None = None  # logits → cap · tanh(logits / cap) when set

    def parameter_count(self) -> int:
        """Distinct parameters, by storage: a tied lm_head, or a projection that views a stacked weight,
        counts once."""
        sizes = {}
        for owner, name in _tensor_slots(self):
            tensor = getattr(owner, name)
            storage = tensor.untyped_storage()
            sizes[storage.data_ptr()] = storage.nbytes() // tensor.element_size()
        return sum(sizes.values())

    def to(self, device: torch.device) -> Weights:
        """Move every tensor to `device` in place, keeping tied tensors tied (call before `fuse`)."""
        moved: dict[int, torch.Tensor] = {}
        for owner, name in _tensor_slots(self):
            tensor = getattr(owner, name)
            key = tensor.data_ptr()
            if key not in moved:
                moved[key] = tensor.to(device)
            setattr(owner, name, moved[key])
        return self


def _tensor_slots(w: Weights):
    """(object, attribute) for every tensor in the weights (fused weights first: the parts are views)."""
    owners = [w, w.norm]
    for layer in w.layers:
        owners.extend([layer.qkv, layer.gate_up])
        owners.extend(getattr(layer, name) for name in _LAYER_PARTS)
    for owner in owners:
        if owner is None:
            continue
        for name in ("embed_tokens", "lm_head", "position_embeddings", "weight", "bias"):
            if isinstance(getattr(owner, name, None), torch.Tensor):
                yield owner, name


_LAYER_PARTS = (
    "input_layernorm",
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "q_norm",
    "k_norm",
    "post_attention_layernorm",
    "gate_proj",
    "up_proj",
    "down_proj",
    "attention_output_norm",
    "mlp_output_norm",
)


def _linear(module) -> Linear:
    bias = module.bias.detach() if getattr(module, "bias", None) is not None else None
    return Linear(module.weight.detach(), bias)


def _rms(module, eps: float, offset: float = 0.0) -> Norm:
    return Norm(module.weight.detach(), None, eps, "rms", offset)


def _activation(name: str):
    if name not in ACT2FN:
        raise UnsupportedModelError(f"activation {name!r} is not supported")
    return ACT2FN[name]


def weights_from_llama_like(hf, config) -> Weights:
    """Llama / SmolLM, Qwen2 (q/k/v bias) and Qwen3 (q_norm, k_norm) share one layout."""
    eps, act = config.rms_norm_eps, _activation(config.hidden_act)
    layers = [
        LayerWeights(
            input_layernorm=_rms(block.input_layernorm, eps),
            post_attention_layernorm=_rms(block.post_attention_layernorm, eps),
            **_llama_projections(block, eps, act),
        )
        for block in hf.model.layers
    ]
    return _decoder_weights(hf, layers, _rms(hf.model.norm, eps))


def weights_from_gemma3(hf, config) -> Weights:
    """Gemma 3: Llama's projections, q/k norms, four (1 + weight) RMSNorms per layer, GeGLU, scaled embeddings."""
    eps, act = config.rms_norm_eps, _activation(config.hidden_activation)
    layers = [
        LayerWeights(
            input_layernorm=_rms(block.input_layernorm, eps, 1.0),
            post_attention_layernorm=_rms(block.pre_feedforward_layernorm, eps, 1.0),
            attention_output_norm=_rms(block.post_attention_layernorm, eps, 1.0),
            mlp_output_norm=_rms(block.post_feedforward_layernorm, eps, 1.0),
            **_llama_projections(block, eps, act, 1.0),
        )
        for block in hf.model.layers
    ]
    return _decoder_weights(
        hf,
        layers,
        _rms(hf.model.norm, eps, 1.0),
        embed_scale=float(hf.model.embed_tokens.scalar_embed_scale),
        final_logit_softcap=config.final_logit_softcapping,
    )


def _llama_projections(block, eps: float, act, norm_offset: float = 0.0) -> dict:
    """A Llama-layout layer's attention and gated-MLP weights, with its q/k norms where it has them."""
    attn, mlp = block.self_attn, block.mlp
    has_qk_norm = hasattr(attn, "q_norm")
    return dict(
        q_proj=_linear(attn.q_proj),
        k_proj=_linear(attn.k_proj),
        v_proj=_linear(attn.v_proj),
        o_proj=_linear(attn.o_proj),
        q_norm=_rms(attn.q_norm, eps, norm_offset) if has_qk_norm else None,
        k_norm=_rms(attn.k_norm, eps, norm_offset) if has_qk_norm else None,
        gate_proj=_linear(mlp.gate_proj),
        up_proj=_linear(mlp.up_proj),
        down_proj=_linear(mlp.down_proj),
        act=act,
    )


def _decoder_weights(hf, layers: list[LayerWeights], norm: Norm, **extra) -> Weights:
    """A decoder with rotary positions (no position table): its layers, final norm, and embedding and head
    (tied when they are one tensor)."""
    embed = hf.get_input_embeddings().weight.detach()
    head = hf.get_output_embeddings().weight.detach()
    return Weights(
        embed_tokens=embed,
        position_embeddings=None,
        layers=layers,
        norm=norm,
        lm_head=head,
        tied=head.data_ptr() == embed.data_ptr(),
        **extra,
    )


def _conv1d(module) -> Linear:
    # transformers' Conv1D stores weight as (in, out); F.linear wants (out, in).
    return Linear(module.weight.detach().t().contiguous(), module.bias.detach())


def _layer_norm(module) -> Norm:
    return Norm(module.weight.detach(), module.bias.detach(), module.eps, "layer")


def weights_from_gpt2(hf, config) -> Weights:
    act = _activation(config.activation_function)
    hidden = config.hidden_size
    layers = []
    for block in hf.transformer.h:
        fused = _conv1d(block.attn.c_attn)  # (3 × hidden, hidden): q, k, v stacked
        q_w, k_w, v_w = fused.weight.split(hidden, dim=0)
        q_b, k_b, v_b = fused.bias.split(hidden, dim=0)
        layers.append(
            LayerWeights(
                input_layernorm=_layer_norm(block.ln_1),
                q_proj=Linear(q_w, q_b),
                k_proj=Linear(k_w, k_b),
                v_proj=Linear(v_w, v_b),
                o_proj=_conv1d(block.attn.c_proj),
                q_norm=None,
                k_norm=None,
                post_attention_layernorm=_layer_norm(block.ln_2),
                gate_proj=None,
                up_proj=_conv1d(block.mlp.c_fc),
                down_proj=_conv1d(block.mlp.c_proj),
                act=act,
            )
        )
    embed = hf.transformer.wte.weight.detach()
    head = hf.get_output_embeddings().weight.detach()
    return Weights(
        embed_tokens=embed,
        position_embeddings=hf.transformer.wpe.weight.detach(),
        layers=layers,
        norm=_layer_norm(hf.transformer.ln_f),
        lm_head=head,
        tied=head.data_ptr() == embed.data_ptr(),
    )

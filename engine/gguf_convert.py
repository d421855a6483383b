"""A Gemma 3 GGUF file → a safetensors model folder, one tensor at a time, without a transformers model.

transformers' own GGUF load dequantizes every tensor, builds the model and holds both (3.2 GB peak for
Gemma 3 270M in float32). Here the safetensors header is written first (every name, dtype, shape and
offset is known from the GGUF's metadata), then each tensor is dequantized by the `gguf` package, put in
transformers' form and appended: the peak is one tensor (the 262,144 × 640 embedding table) beside the
mapped GGUF file. The values are those transformers computes from the same file (the same `dequantize`,
the same `norm − 1`: llama.cpp stores Gemma's norm weights as 1 + w), checked in tests/test_embedded_zh.py.
The config and the tokenizer are transformers' own readings of the GGUF's metadata (no tensors read).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from engine.safetensors_stream import write_streamed

# GGUF tensor names (llama.cpp's) → transformers' Gemma 3 names; `{}` is the layer number.
GEMMA3_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "blk.{}.attn_norm.weight": "model.layers.{}.input_layernorm.weight",
    "blk.{}.attn_q.weight": "model.layers.{}.self_attn.q_proj.weight",
    "blk.{}.attn_k.weight": "model.layers.{}.self_attn.k_proj.weight",
    "blk.{}.attn_v.weight": "model.layers.{}.self_attn.v_proj.weight",
    "blk.{}.attn_output.weight": "model.layers.{}.self_attn.o_proj.weight",
    "blk.{}.attn_q_norm.weight": "model.layers.{}.self_attn.q_norm.weight",
    "blk.{}.attn_k_norm.weight": "model.layers.{}.self_attn.k_norm.weight",
    "blk.{}.post_attention_norm.weight": "model.layers.{}.post_attention_layernorm.weight",
    "blk.{}.ffn_norm.weight": "model.layers.{}.pre_feedforward_layernorm.weight",
    "blk.{}.post_ffw_norm.weight": "model.layers.{}.post_feedforward_layernorm.weight",
    "blk.{}.ffn_gate.weight": "model.layers.{}.mlp.gate_proj.weight",
    "blk.{}.ffn_up.weight": "model.layers.{}.mlp.up_proj.weight",
    "blk.{}.ffn_down.weight": "model.layers.{}.mlp.down_proj.weight",
}


def hf_name(gguf_name: str) -> str:
    """transformers' name for a Gemma 3 GGUF tensor; ValueError for a tensor the mapping does not know."""
    layer = re.match(r"blk\.(\d+)\.", gguf_name)
    key = gguf_name.replace(f"blk.{layer.group(1)}.", "blk.{}.", 1) if layer else gguf_name
    if key not in GEMMA3_NAMES:
        raise ValueError(f"unexpected tensor {gguf_name!r} in a Gemma 3 GGUF file")
    return GEMMA3_NAMES[key].format(layer.group(1)) if layer else GEMMA3_NAMES[key]


ROWS_AT_ONCE = 4096  # rows dequantized together: `dequantize` holds a few float32 copies of what it is given


def tensor_values(tensor, name: str, dtype: torch.dtype):
    """One GGUF tensor in transformers' form (out, in), dequantized to float32 a few thousand rows at a time
    and cast to `dtype`, its norm weights back to w: an iterator of consecutive row chunks."""
    from gguf import dequantize

    shape = tuple(int(n) for n in reversed(tensor.shape))
    data = tensor.data.reshape(shape[0], -1) if len(shape) > 1 else tensor.data.reshape(1, -1)
    for start in range(0, data.shape[0], ROWS_AT_ONCE):
        values = dequantize(data[start : start + ROWS_AT_ONCE], tensor.tensor_type).astype(np.float32, copy=False)
        if "norm.weight" in name:
            values = values - 1  # in float32, as transformers' Gemma GGUF processor does
        yield torch.from_numpy(np.ascontiguousarray(values).reshape(-1)).to(dtype)


def write_safetensors(gguf: Path, target: Path, dtype: torch.dtype) -> None:
    """The GGUF's tensors in one safetensors file, written a tensor at a time (header first)."""
    from gguf import GGUFReader

    reader = GGUFReader(gguf)
    tensors = {hf_name(tensor.name): tensor for tensor in reader.tensors}
    shapes = {name: [int(n) for n in reversed(tensor.shape)] for name, tensor in tensors.items()}
    write_streamed(target, shapes, dtype, lambda name: tensor_values(tensors[name], name, dtype))


def convert_gemma3(gguf: Path, folder: Path, dtype: torch.dtype, name_or_path: str) -> None:
    """config.json, model.safetensors and the tokenizer's files of the GGUF model, into `folder`."""
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if config.model_type != "gemma3_text":
        raise ValueError(f"{gguf.name} holds a {config.model_type!r} model, not Gemma 3")
    config.architectures = ["Gemma3ForCausalLM"]
    config.dtype = dtype
    config._name_or_path = name_or_path
    config.save_pretrained(folder)
    write_safetensors(gguf, folder / "model.safetensors", dtype)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(folder)

"""Published models the lesson compares the loaded one with, from their configs: one place for their numbers.

QWEN3_0_6B is Qwen/Qwen3-0.6B's config.json (the fields that set its sizes). `reference_info` turns a config
into the engine's `ModelInfo` without weights: the parameters are counted on transformers' own model built on
the meta device (no memory, no download), so nothing about the architecture is written out twice.
"""

from __future__ import annotations

import functools

import torch

from engine.model_info import ModelInfo

QWEN3_0_6B = dict(
    model_type="qwen3",
    vocab_size=151_936,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40_960,
    tie_word_embeddings=True,
    torch_dtype="bfloat16",
)
REFERENCES = {"Qwen3-0.6B": QWEN3_0_6B}


@functools.cache
def reference_info(name: str) -> ModelInfo:
    """The ModelInfo of a published model in REFERENCES, in its published dtype."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(REFERENCES[name])
    dtype = fields.pop("torch_dtype")
    config = AutoConfig.for_model(**fields)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return ModelInfo(
        name=name,
        family=config.model_type,
        layers=config.num_hidden_layers,
        hidden=config.hidden_size,
        q_heads=config.num_attention_heads,
        kv_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        intermediate=config.intermediate_size,
        vocab=config.vocab_size,
        tied_embeddings=config.tie_word_embeddings,
        context_limit=config.max_position_embeddings,
        dtype=dtype,
        parameters=sum(p.numel() for p in model.parameters()),  # each tensor once: a tied lm_head counts once
        norm="RMSNorm",
        positions="RoPE (default)",
    )

"""`load_model(spec)`: the embedded default, a local folder or a hub id, read through transformers.

transformers reads the config, tokenizer and weights (safetensors or GGUF; `trust_remote_code` is
never used); we take its tensors and run our own forward pass (`engine.model`).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import torch

from engine import embedded
from engine.errors import ModelNotFoundError, UnsupportedModelError
from engine.model import Model
from engine.model_info import ModelInfo
from engine.rope import Rope
from engine.weights import weights_from_gemma3, weights_from_gpt2, weights_from_llama_like

EMBEDDED = "embedded"
EMBEDDED_NAMES = {EMBEDDED: f"{embedded.HUB_ID} (embedded)", embedded.ZH: f"{embedded.ZH_HUB_ID} (embedded-zh)"}
SUPPORTED_FAMILIES = ("llama", "qwen2", "qwen3", "gpt2", "gemma3_text")
# transformers' names of Gemma 3's layer types, as our layer kinds
LAYER_KINDS = {"full_attention": "global", "sliding_attention": "local"}
GEMMA_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")
AUTO = "auto"  # a model's own dtype (`held_dtype`): what the app asks for by default
# The dtype each embedded model is held in under AUTO. SmolLM2 stays float32: its weights are small (0.54 GB), and
# in bfloat16 its tokens drift with how a prompt is split between a prefix hit and the positions computed (the
# matmul kernels round differently for a different number of rows; a warm run and a cold one parted within 40
# tokens in 6 of 10 runs measured), which would break "a link rebuilds the same tokens". Gemma 3 270M is held in
# bfloat16: its float32 copy (1.07 GB) does not fit a small host beside SmolLM2, and its runs did not part so.
EMBEDDED_DTYPES = {EMBEDDED: torch.float32, embedded.ZH: torch.bfloat16}
# owner/name, as the hub spells repository ids; nothing that could climb out of a folder.
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_source(spec: str, dtype: torch.dtype = torch.float32) -> str | embedded.InMemory:
    """The folder or hub id that `spec` names (for an embedded model, its converted folder in `dtype`, or
    possibly the model in memory); raises ModelNotFoundError for anything else."""
    if not isinstance(spec, str) or not spec.strip():
        raise ModelNotFoundError(
            "no model given: use 'embedded', 'embedded-zh', a local folder or a hub id like 'Qwen/Qwen3-0.6B'"
        )
    spec = spec.strip()
    if spec == EMBEDDED:
        return embedded.embedded_source(dtype)
    if spec == embedded.ZH:
        return embedded.zh_source(dtype)
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"folder {spec!r} has no config.json, so it holds no transformers model")
        return str(path)
    if _HUB_ID.match(spec) and ".." not in spec and not path.exists():
        return spec
    raise ModelNotFoundError(f"no model folder or hub id {spec!r}: use 'embedded', a local folder or a hub id")


def load_model(
    spec: str = EMBEDDED, device: str | torch.device = "auto", dtype: torch.dtype | str = torch.float32
) -> Model:
    """Load a decoder-only model of a supported family, its weights in `dtype` (AUTO: `held_dtype`).

    Raises ModelNotFoundError when nothing can be read under `spec`, and UnsupportedModelError when
    its architecture is not one of SUPPORTED_FAMILIES (or uses a feature the engine does not model).
    """
    if dtype == AUTO and isinstance(spec, str) and spec.strip() in EMBEDDED_DTYPES:
        dtype = EMBEDDED_DTYPES[spec.strip()]
    source = resolve_source(spec, dtype)
    target = resolve_device(device)
    if isinstance(source, embedded.InMemory):  # the cache could not be written: converted in this process
        # float32 as converted; another dtype gets a copy, so the model kept for later loads stays float32.
        hf = source.model if dtype == torch.float32 else copy.deepcopy(source.model).to(dtype)
        config, tokenizer = hf.config, source.tokenizer
    else:
        config, tokenizer, hf = _read(spec, source, dtype)
    hf.eval()
    if config.model_type == "gpt2":
        weights = weights_from_gpt2(hf, config)
        blocks, ropes, positions = hf.transformer.h, None, "learned"
        scales = [block.attn.scaling for block in blocks]
    else:
        gemma = config.model_type == "gemma3_text"
        weights = (weights_from_gemma3 if gemma else weights_from_llama_like)(hf, config)
        blocks, ropes = hf.model.layers, _ropes(hf.model.rotary_emb, config)
        scales = [block.self_attn.scaling for block in blocks]
        positions = f"RoPE ({(ropes.get('global') or ropes['local']).rope_type})"
    if target.type != "cpu":
        weights = weights.to(target)
    owned = not (isinstance(source, embedded.InMemory) and hf is source.model)
    for layer, block in zip(weights.layers, blocks):
        layer.fuse()
        if owned:  # transformers' own tensors of this layer go now, not after the whole load: no second copy
            block.to("meta")
    shed_build_tables(tokenizer)
    name = EMBEDDED_NAMES.get(spec.strip(), spec.strip())
    info = _info(name, config, weights, weights.embed_tokens.dtype, positions)
    return Model(weights, info, tokenizer, ropes, scales, _eos_ids(hf, config, tokenizer), target)


def shed_build_tables(tokenizer) -> None:
    """Drop the vocabulary and merges a transformers 5 tokenizer keeps after building its `tokenizers` backend from
    them: only its constructor reads them (the backend holds its own), and Gemma 3's, 262,144 entries and 514,906
    merges as Python objects, hold ~144 MiB, more than the backend itself (~94 MiB)."""
    for name in ("_vocab", "_merges"):
        table = getattr(tokenizer, name, None)
        if isinstance(table, (dict, list)):
            setattr(tokenizer, name, type(table)())


def _ropes(rotary_module, config) -> dict[str, Rope]:
    """The RoPE of each layer kind: one for every family but Gemma 3, whose local and global layers turn
    with different bases."""
    if config.model_type != "gemma3_text":
        return {"global": Rope.from_hf(rotary_module)}
    return {LAYER_KINDS[kind]: Rope.from_hf(rotary_module, kind) for kind in sorted(set(config.layer_types))}


def _layer_windows(config) -> tuple[int | None, ...]:
    """Each layer's sliding window (None: global); empty for families without local layers."""
    if config.model_type != "gemma3_text":
        return ()
    return tuple(config.sliding_window if kind == "sliding_attention" else None for kind in config.layer_types)


def _read(spec: str, source: str, dtype: torch.dtype | str):
    """(config, tokenizer, transformers model) from a folder or hub id; the family is checked before the weights."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=False)
    except ValueError as error:  # a model_type transformers does not know
        raise UnsupportedModelError(
            f"{spec!r}: {_first_line(error)}; supported: {', '.join(SUPPORTED_FAMILIES)}"
        ) from error
    except OSError as error:
        raise ModelNotFoundError(f"cannot read model {spec!r}: {_first_line(error)}") from error
    _check_supported(spec, config)
    if dtype == AUTO:
        dtype = held_dtype(config)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
        hf = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, trust_remote_code=False)
    except OSError as error:
        raise ModelNotFoundError(f"cannot read model {spec!r}: {_first_line(error)}") from error
    return config, tokenizer, hf


def held_dtype(config) -> torch.dtype:
    """The dtype a model is held in when AUTO is asked: bfloat16 when its checkpoint was saved in bfloat16 (as
    Qwen3-0.6B is: float32 would double its 1.19 GB), else float32. The embedded models: EMBEDDED_DTYPES."""
    saved = str(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "")
    return torch.bfloat16 if saved.removeprefix("torch.") == "bfloat16" else torch.float32


def _check_supported(spec: str, config) -> None:
    family = config.model_type
    if family not in SUPPORTED_FAMILIES:
        raise UnsupportedModelError(
            f"{spec!r} is a {family!r} model; kvscope supports these families: {', '.join(SUPPORTED_FAMILIES)}"
        )
    if getattr(config, "use_sliding_window", False):
        raise UnsupportedModelError(f"{spec!r} uses sliding-window attention, which kvscope does not model")
    if family == "gemma3_text":
        if getattr(config, "attn_logit_softcapping", None) is not None:
            raise UnsupportedModelError(
                f"{spec!r} caps its attention scores (attn_logit_softcapping), which kvscope does not model"
            )
        if getattr(config, "use_bidirectional_attention", False):
            raise UnsupportedModelError(f"{spec!r} uses bidirectional attention; kvscope shows causal decoders")
        if set(config.layer_types) - set(LAYER_KINDS):
            raise UnsupportedModelError(
                f"{spec!r} has layer types {sorted(set(config.layer_types))}; kvscope models {', '.join(LAYER_KINDS)}"
            )
    if family == "gpt2" and getattr(config, "add_cross_attention", False):
        raise UnsupportedModelError(f"{spec!r} has cross-attention; kvscope shows decoder-only models")


def _info(name: str, config, weights, dtype: torch.dtype, positions: str) -> ModelInfo:
    q_heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // q_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or q_heads
    return ModelInfo(
        name=name,
        family=config.model_type,
        layers=config.num_hidden_layers,
        hidden=config.hidden_size,
        q_heads=q_heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=weights.layers[0].up_proj.weight.shape[0],
        vocab=weights.embed_tokens.shape[0],
        tied_embeddings=weights.tied,
        context_limit=config.max_position_embeddings,
        dtype=str(dtype).removeprefix("torch."),
        parameters=weights.parameter_count(),
        norm="LayerNorm" if config.model_type == "gpt2" else "RMSNorm",
        positions=positions,
        layer_windows=_layer_windows(config),
        layer_norms=GEMMA_NORMS if config.model_type == "gemma3_text" else ModelInfo.layer_norms,
    )


def _eos_ids(hf, config, tokenizer) -> set[int]:
    ids: set[int] = set()
    for value in (getattr(hf.generation_config, "eos_token_id", None), config.eos_token_id, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(v for v in value if isinstance(v, int))
    return ids


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__

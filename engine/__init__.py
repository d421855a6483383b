"""kvscope's decode engine: pure PyTorch, no UI. See docs/engine-api.md for the API."""

from engine import split_kv
from engine.errors import (
    CacheFullError,
    EmptyPromptError,
    GenerationStateError,
    InvalidSettingError,
    KvscopeError,
    ModelNotFoundError,
    PromptTooLongError,
    UnsupportedModelError,
)
from engine.generation import Generation
from engine.kv_cache import BlockPool, BlockTable
from engine.loader import EMBEDDED, SUPPORTED_FAMILIES, load_model
from engine.model import Model, between_layers
from engine.model_info import ModelInfo
from engine.prefix_cache import REUSE_POLICIES, PrefixCache
from engine.sampler import Sampling
from engine.trace import NO_RECORD, Candidate, Capture, PrefixHit, SplitKVTrace, StepTrace

__all__ = [
    "EMBEDDED",
    "REUSE_POLICIES",
    "SUPPORTED_FAMILIES",
    "BlockPool",
    "BlockTable",
    "CacheFullError",
    "Candidate",
    "NO_RECORD",
    "Capture",
    "Generation",
    "PrefixCache",
    "PrefixHit",
    "SplitKVTrace",
    "split_kv",
    "EmptyPromptError",
    "InvalidSettingError",
    "KvscopeError",
    "Model",
    "ModelInfo",
    "ModelNotFoundError",
    "PromptTooLongError",
    "Sampling",
    "GenerationStateError",
    "StepTrace",
    "UnsupportedModelError",
    "between_layers",
    "load_model",
]

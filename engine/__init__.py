"""kvscope's decode engine: pure PyTorch, no UI. See README.md for the API."""

from engine.errors import (
    EmptyPromptError,
    InvalidSettingError,
    KvscopeError,
    ModelNotFoundError,
    PromptTooLongError,
    SessionStateError,
    UnsupportedModelError,
)
from engine.kv_cache import BlockPool, BlockTable
from engine.loader import EMBEDDED, SUPPORTED_FAMILIES, load_model
from engine.model import Model, ModelInfo
from engine.sampler import Sampling
from engine.session import DecodeSession
from engine.trace import Candidate, Capture, StepTrace

__all__ = [
    "EMBEDDED", "SUPPORTED_FAMILIES", "BlockPool", "BlockTable", "Candidate", "Capture", "DecodeSession",
    "EmptyPromptError", "InvalidSettingError", "KvscopeError", "Model", "ModelInfo", "ModelNotFoundError",
    "PromptTooLongError", "Sampling", "SessionStateError", "StepTrace", "UnsupportedModelError", "load_model",
]

"""Exceptions the engine raises for bad input. Each message says what was wrong and what is allowed.

All derive from `KvscopeError`, so a caller (the app) can catch one type and show `str(error)`.
Those about values also derive from `ValueError`.
"""


class KvscopeError(Exception):
    """Base class: a problem with what the caller asked for, not a bug in the engine."""


class ModelNotFoundError(KvscopeError):
    """The model spec names no folder, hub id or installed package that can be read."""


class UnsupportedModelError(KvscopeError, ValueError):
    """The model exists but its architecture (or a feature of it) is not one the engine implements."""


class EmptyPromptError(KvscopeError, ValueError):
    """The prompt is empty or only whitespace."""


class PromptTooLongError(KvscopeError, ValueError):
    """The prompt leaves no room for an answer within the model's context limit."""


class InvalidSettingError(KvscopeError, ValueError):
    """A sampling or cache setting is outside its allowed range."""


class GenerationStateError(KvscopeError, RuntimeError):
    """A generation method was called out of order (step before prefill, after close, after the end)."""


class CacheFullError(KvscopeError, MemoryError):
    """Every block of a KV pool is in use; none can be evicted."""

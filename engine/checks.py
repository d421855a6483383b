"""The checks of one setting's value: an integer, or a real number, in a range.

A bool is an int to Python (True == 1), but never a setting's count or share, so every check here refuses it.
`require_integer` and `require_number` raise `InvalidSettingError` with a message that names the setting and
its range; `is_integer` only answers, for a check that raises its own error (a list of token ids, a generation's
step). This module imports nothing of the engine but its errors, so any module can use it without an import
circle.
"""

from __future__ import annotations

from engine.errors import InvalidSettingError


def is_integer(value) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def require_integer(name: str, value, low: int, high: int | None = None, why: str = "") -> None:
    """An int (not a bool) in [low, high] (high None: no upper bound); else InvalidSettingError naming the setting
    and its range, then `why` (e.g. " (0 = off)", " (the engine's limit)")."""
    if not is_integer(value) or value < low or (high is not None and value > high):
        allowed = f"an integer ≥ {low}" if high is None else f"an integer from {low} to {high}"
        raise InvalidSettingError(f"{name} must be {allowed}{why}, got {value!r}")


def require_number(
    name: str, value, low: float, high: float, *, low_open: bool = False, high_open: bool = False, why: str = ""
) -> None:
    """A real number (an int or a float, not a bool) from `low` to `high`, each end included unless it is open;
    else InvalidSettingError naming the setting and its range, then `why`. NaN is in no range."""
    in_range = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and (value > low if low_open else value >= low)
        and (value < high if high_open else value <= high)
    )
    if not in_range:
        start = f"above {low}" if low_open else f"from {low}"
        end = f"up to (not including) {high}" if high_open else (f"up to {high}" if low_open else f"to {high}")
        raise InvalidSettingError(f"{name} must be a number {start} {end}{why}, got {value!r}")

"""engine.checks: an integer or a real number in a range, never a bool, and the message that names the range."""

import math

import pytest

from engine.checks import is_integer, require_integer, require_number
from engine.errors import InvalidSettingError


@pytest.mark.parametrize(
    "value, expected",
    [(0, True), (-3, True), (2**70, True), (True, False), (False, False), (1.0, False), ("1", False), (None, False)],
)
def test_is_integer_is_an_int_that_is_not_a_bool(value, expected):
    assert is_integer(value) is expected


@pytest.mark.parametrize("value", [1, 5, 8])
def test_require_integer_takes_an_integer_in_its_range(value):
    require_integer("k", value, 1, 8)


@pytest.mark.parametrize("value", [0, 9, True, 2.0, "3", None])
def test_require_integer_refuses_anything_else(value):
    with pytest.raises(InvalidSettingError, match=rf"k must be an integer from 1 to 8 \(the limit\), got {value!r}"):
        require_integer("k", value, 1, 8, " (the limit)")


def test_require_integer_without_an_upper_bound():
    require_integer("n", 10**9, 0)
    with pytest.raises(InvalidSettingError, match=r"^n must be an integer ≥ 0 \(0 = off\), got -1$"):
        require_integer("n", -1, 0, why=" (0 = off)")


@pytest.mark.parametrize("value", [0, 0.5, 1, 1.0])
def test_require_number_includes_both_ends_by_default(value):
    require_number("share", value, 0, 1)


@pytest.mark.parametrize(
    "value, low_open, high_open, allowed",
    [
        (1, False, True, "from 0 up to (not including) 1"),
        (0, True, False, "above 0 up to 1"),
        (0.0, True, True, "above 0 up to (not including) 1"),
        (1.5, False, False, "from 0 to 1"),
        (-0.1, False, False, "from 0 to 1"),
        (True, False, False, "from 0 to 1"),
        (math.nan, False, False, "from 0 to 1"),
        ("0.5", False, False, "from 0 to 1"),
    ],
)
def test_require_number_refuses_an_open_end_and_what_is_no_number(value, low_open, high_open, allowed):
    with pytest.raises(InvalidSettingError) as raised:
        require_number("share", value, 0, 1, low_open=low_open, high_open=high_open, why=" (of the rows)")
    assert str(raised.value) == f"share must be a number {allowed} (of the rows), got {value!r}"

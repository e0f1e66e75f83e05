"""Type checks of configuration values, shared by every config and argument check: a bool
is not a number here (`True` is an `int` to Python, never a meaningful size or rate)."""

from __future__ import annotations

import numbers

__all__ = ["is_int", "is_real"]


def is_int(value) -> bool:
    """Whether `value` is an integer (any `numbers.Integral`, numpy's included), not a bool."""
    return not isinstance(value, bool) and isinstance(value, numbers.Integral)


def is_real(value) -> bool:
    """Whether `value` is a real number (any `numbers.Real`, ints included), not a bool."""
    return not isinstance(value, bool) and isinstance(value, numbers.Real)

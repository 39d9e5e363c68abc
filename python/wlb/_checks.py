"""The checks every Python entry point of wlb makes on a number it is given, so they agree: a
Python or numpy integer (or real) is taken where an int (or float) is expected, a bool never is
(True is not 1 token), and a refusal names the argument, the value and its type."""

from __future__ import annotations

import math
import numbers
from typing import Any, Optional

import numpy as np


def describe(value: Any) -> str:
    """The value and its type, for messages: ``2.5 (numpy.float32)``, ``True (bool)``; a long
    value is cut to 80 characters."""
    kind = type(value)
    module = kind.__module__
    name = kind.__name__ if module in ("builtins", None) else f"{module}.{kind.__name__}"
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return f"{shown} ({name})"


def is_integer(value: Any) -> bool:
    """A Python or numpy integer, not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def is_real(value: Any) -> bool:
    """A Python or numpy real number (integers included), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def integer(name: str, value: Any, low: Optional[int] = None, high: Optional[int] = None) -> int:
    """``value`` as an int when it is an integer in [low, high] (either bound optional), else a
    ValueError naming ``name``, the range, the value and its type."""
    if is_integer(value) and (low is None or value >= low) and (high is None or value <= high):
        return int(value)
    bounds = f"[{'-inf' if low is None else low}, {'inf' if high is None else high}]"
    raise ValueError(f"{name} must be an integer in {bounds}, got {describe(value)}")


def real(name: str, value: Any, low: float = -math.inf, high: float = math.inf, *,
         low_open: bool = False) -> float:
    """``value`` as a float when it is a finite real number in [low, high] (``(low, high]`` with
    ``low_open``), else a ValueError naming ``name``, the range, the value and its type."""
    if is_real(value):
        try:
            v = float(value)
        except OverflowError:  # an int beyond the double range
            v = math.inf
        if math.isfinite(v) and (v > low if low_open else v >= low) and v <= high:
            return v
    bounds = f"{'(' if low_open else '['}{low:g}, {high:g}]"
    raise ValueError(f"{name} must be a finite number in {bounds}, got {describe(value)}")

"""Checks of the numbers users pass to planners, each naming the argument and what it must be.

Python and NumPy coerce quietly: ``int(2.7)`` is 2, ``int(True)`` is 1, ``int("12")`` is 12, and
``np.prod`` of large dimensions wraps around int64. These refuse instead.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

from workbench.core.units import MiB

#: The most ranks a plan may shard over: plans allocate a few int64 arrays of this length (and the
#: greedy layout a heap), so 2**40 ranks would allocate until MemoryError. A million is above any
#: machine built so far.
MAX_NUM_SHARDS = 2**20


def integer(name: str, value: object, *, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an ``int`` if it is an integer (Python or NumPy, not bool) within ``[low, high]``.

    Raises:
        ValueError: naming ``name``, the value, and the allowed range.
    """
    ok = isinstance(value, Integral) and not isinstance(value, bool)
    if ok and (low is None or value >= low) and (high is None or value <= high):
        return int(value)
    bounds = " and ".join(part for part in (f">= {low}" if low is not None else "",
                                            f"<= {high:,}" if high is not None else "") if part)
    raise ValueError(f"{name} must be an integer{' ' + bounds if bounds else ''}, got {value!r}.")


def byte_count(name: str, value: object) -> int:
    """A size in bytes: an integer, or a float with an integral value (``32e6``); not NaN, inf, a string or bool.

    Raises:
        ValueError: naming ``name`` and suggesting the form to use.
    """
    if isinstance(value, Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value) and float(value).is_integer():
        return int(value)
    raise ValueError(f"{name} must be a whole number of bytes (e.g. 32 * MiB = {32 * MiB}), got {value!r}.")

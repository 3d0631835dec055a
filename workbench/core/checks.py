"""Checks of the numbers and files users pass in, each naming the argument (or field and file) at fault.

Python and NumPy coerce quietly: ``int(2.7)`` is 2, ``int(True)`` is 1, ``int("12")`` is 12, and
``np.prod`` of large dimensions wraps around int64. These refuse instead. Python's own errors on
hostile JSON name nothing (``RecursionError`` on deep nesting, "Exceeds the limit (4300 digits)" on a
long integer, and a repeated key silently keeps its last value): :func:`loads_bounded` names the
field and the file, and :func:`shown` prints any value in an error message without raising.
"""

from __future__ import annotations

import json
import math
import re
import reprlib
from numbers import Integral, Real
from typing import Any, Callable, Iterable

import numpy as np

from workbench.core.units import MiB

#: The most ranks a plan may shard over: plans allocate a few int64 arrays of this length (and the
#: greedy layout a heap), so 2**40 ranks would allocate until MemoryError. A million is above any
#: machine built so far.
MAX_NUM_SHARDS = 2**20

# Bounds on a model config (workbench.core.hf_config), so that none builds for minutes or runs out of
# memory; each is far above any published model.
#: The largest value of any size field (elements, heads, positions): hidden sizes reach 2**14, vocabularies 2**18.
MAX_CONFIG_SIZE = 2**40
#: The most transformer blocks (published models have under 200).
MAX_NUM_LAYERS = 4096
#: The most routed experts per block (published models have at most 512).
MAX_NUM_EXPERTS = 4096
#: The most parameter arrays a config may make: about 6x DeepSeek-V3's 45,395, a few seconds to build.
MAX_NUM_ARRAYS = 2**18
#: The most parameters (elements) a config may describe: about 1,500x DeepSeek-V3's 671 billion.
MAX_NUM_PARAMS = 10**15


def as_whole(value: object, *, magnitude: bool = False) -> int | None:
    """The one rule for whole numbers, as an ``int``, or None where ``value`` is not one.

    A count (ranks, shards, steps, layers, a dimension) is a Python or NumPy integer, never a bool or a
    float: ``np.int64(8)`` is 8, ``8.0`` is refused (a float there is a slip). A ``magnitude`` (bytes, a
    parameter count) may also be written as a finite float with an integral value: ``32e6``, ``1e9``.
    """
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, Integral):
        return int(value)
    if magnitude and isinstance(value, Real) and math.isfinite(value) and float(value).is_integer():
        return int(value)
    return None


def integer(name: str, value: object, *, low: int | None = None, high: int | None = None,
            magnitude: bool = False) -> int:
    """``value`` as an ``int`` if it is a whole number (:func:`as_whole`) within ``[low, high]``.

    Raises:
        ValueError: naming ``name``, the value, and the allowed range.
    """
    whole = as_whole(value, magnitude=magnitude)
    if whole is not None and (low is None or whole >= low) and (high is None or whole <= high):
        return whole
    bounds = " and ".join(part for part in (f">= {low}" if low is not None else "",
                                            f"<= {high:,}" if high is not None else "") if part)
    raise ValueError(f"{name} must be an integer{' ' + bounds if bounds else ''}, got {value!r}.")


def byte_count(name: str, value: object) -> int:
    """A size in bytes: an integer, or a float with an integral value (``32e6``); not NaN, inf, a string or bool.

    Raises:
        ValueError: naming ``name`` and suggesting the form to use.
    """
    whole = as_whole(value, magnitude=True)
    if whole is not None:
        return whole
    raise ValueError(f"{name} must be a whole number of bytes (e.g. 32 * MiB = {32 * MiB}), got {value!r}.")


class BoundedList(list):
    """A list whose ``+=`` raises ``error()`` once it holds more than ``limit`` items.

    Args:
        items: The first items.
        limit: The most items.
        error: Makes the exception to raise (naming what made the list grow).
    """

    def __init__(self, items: Iterable[Any], limit: int, error: Callable[[], Exception]) -> None:
        super().__init__(items)
        self.limit, self.error = limit, error

    def __iadd__(self, more: Iterable[Any]) -> "BoundedList":
        super().__iadd__(more)
        if len(self) > self.limit:
            raise self.error()
        return self


#: JSON nested deeper than this is refused (no config or record nests past a handful of levels, and
#: Python's parser raises RecursionError near 1,000). The same bound as ``workbench.runs.store``.
MAX_JSON_DEPTH = 64
#: Digits of the longest JSON integer accepted (int64 has 19; Python refuses past 4,300 naming nothing).
MAX_JSON_INT_DIGITS = 100

_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_JSON_COLON = re.compile(r"\s*:")


class _LongInt(str):
    """The digits of a JSON integer longer than :data:`MAX_JSON_INT_DIGITS`, kept to name its field."""


class _JSONRefused(ValueError):
    """A JSON text refused by :func:`loads_bounded`'s own checks (not a syntax error)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _JSONRefused(f"field {shown(key)} appears twice in one object (JSON keeps the last "
                                   "silently).")
            seen.add(key)
    return obj


def json_too_deep(text: str) -> str | None:
    """Why ``text`` nests past :data:`MAX_JSON_DEPTH` (naming its top-level field), or ``None``."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:  # the common case: no scan needed
        return None
    masked = _JSON_STRING.sub(lambda m: "_" * len(m.group()), text)  # brackets inside strings do not nest
    codes = np.frombuffer(masked.encode("utf-32-le", "surrogatepass"), np.uint32)
    depth = np.cumsum((codes == ord("[")) | (codes == ord("{")), dtype=np.int64)
    depth -= np.cumsum((codes == ord("]")) | (codes == ord("}")), dtype=np.int64)
    over = np.flatnonzero(depth > MAX_JSON_DEPTH)
    if not over.size:
        return None
    keys = [m.group() for m in _JSON_STRING.finditer(text, 0, int(over[0]))
            if depth[m.start()] == 1 and _JSON_COLON.match(text, m.end())]
    what = f"field {shown(json.loads(keys[-1]))}" if keys else "the JSON"
    return f"{what} is nested deeper than {MAX_JSON_DEPTH} levels."


def _long_int_at(value: Any, path: str = "") -> tuple[str, int] | None:
    """``(path, digits)`` of the first :class:`_LongInt` in ``value`` (nesting is already bounded)."""
    if isinstance(value, _LongInt):
        return path, len(value.lstrip("-"))
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _long_int_at(item, f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else key)
        if found:
            return found
    return None


def read_user_text(path, max_bytes: int, where: str, too_large: str) -> str:
    """The UTF-8 text of a file a user edits (a config, a hosts file), read no further than ``max_bytes``.

    The caller checks first that ``path`` is a regular file (a FIFO would block the read).

    Args:
        path: The file.
        max_bytes: Largest size accepted, bytes.
        where: How messages name the file (e.g. ``"hosts file h.toml"``).
        too_large: Why no such file is that large, for the message.

    Raises:
        ValueError: starting with ``where``: the file cannot be read, is larger than ``max_bytes``, or
            is not UTF-8 (naming the byte).
    """
    try:
        with open(path, "rb") as file:
            data = file.read(max_bytes + 1)
    except OSError as err:
        raise ValueError(f"{where}: cannot be read ({err.strerror or err}).") from None
    if len(data) > max_bytes:
        raise ValueError(f"{where}: larger than {max_bytes:,} bytes, {too_large}.")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{where}: not UTF-8 text (byte {err.start}: {err.reason}).") from None


def loads_bounded(text: str | bytes, where: str = "JSON") -> Any:
    """``json.loads`` that refuses what Python would fail on without naming the field or the file.

    Refused: nesting deeper than :data:`MAX_JSON_DEPTH`; an integer of more than
    :data:`MAX_JSON_INT_DIGITS` digits; a key repeated within one object; and invalid JSON.

    Args:
        text: The JSON text (bytes are decoded as UTF-8, bad bytes replaced).
        where: The file (or other source) the text came from, for error messages.

    Raises:
        ValueError: starting with ``where`` and naming the field at fault where there is one.
    """
    text = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    deep = json_too_deep(text)
    if deep:
        raise ValueError(f"{where}: {deep}")
    long_ints: list[_LongInt] = []

    def parse_int(digits: str) -> int | _LongInt:
        if len(digits) - digits.startswith("-") <= MAX_JSON_INT_DIGITS:
            return int(digits)
        long_ints.append(_LongInt(digits))
        return long_ints[-1]

    try:
        value = json.loads(text, parse_int=parse_int, object_pairs_hook=_unique_keys)
    except _JSONRefused as err:
        raise ValueError(f"{where}: {err}") from None
    except (ValueError, RecursionError) as err:  # JSONDecodeError is a ValueError
        raise ValueError(f"{where}: not valid JSON ({err}).") from None
    if long_ints:
        path, digits = _long_int_at(value) or ("?", len(long_ints[0]))
        raise ValueError(f"{where}: field '{path}' holds a {digits:,}-digit integer; at most "
                         f"{MAX_JSON_INT_DIGITS} digits are read.")
    return value


class _Short(reprlib.Repr):
    """``reprlib`` limits, and integers past Python's 4,300-digit ``repr`` limit shown by size."""

    def __init__(self) -> None:
        super().__init__()
        self.maxstring, self.maxother, self.maxlevel = 80, 80, 3

    def repr_int(self, x: int, level: int) -> str:
        return f"<a {x.bit_length():,}-bit integer>" if x.bit_length() > 256 else super().repr_int(x, level)


_SHORT = _Short()


def shown(value: object) -> str:
    """A short ``repr`` of ``value`` for an error message; never raises (huge integers, deep nesting, cycles)."""
    return _SHORT.repr(value)

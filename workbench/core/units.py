"""Byte units, and numbers formatted for people. Sizes in this package are bytes unless a name says otherwise.

One formatting home (issue 29): counts with their noun (``plural``: "1 array"), times in the unit that
reads (``format_seconds``: "25.6 s", not "25595.5 ms"), parameter counts (``format_params``: "44.4M
parameters", not "0.0444B"), table cells (``format_number``: thousands separators, no NaN or None), and
bytes in one unit family per view (``format_bytes(..., unit=...)``, ``byte_unit``).
"""

from __future__ import annotations

import math

KiB = 2**10
MiB = 2**20
GiB = 2**30
#: Binary byte units, the one family of every view that does not follow a paper's decimal GB.
BYTE_UNITS = {"B": 1, "KiB": KiB, "MiB": MiB, "GiB": GiB, "TiB": 2**40}
#: Shown for a value that is missing (None, NaN) in a table a person reads.
MISSING = "–"


def byte_unit(num_bytes: float) -> str:
    """The binary unit ``format_bytes`` picks for ``num_bytes``; pass it as ``unit=`` to keep a view's
    other sizes in the same unit (the largest value of the view is the one to ask about)."""
    value = abs(float(num_bytes))
    return next((u for u, s in reversed(BYTE_UNITS.items()) if value >= s), "B")


def format_bytes(num_bytes: float, unit: str | None = None) -> str:
    """A byte count with binary prefixes: ``format_bytes(3 * MiB) == '3.00 MiB'``; ``unit`` (a key of
    :data:`BYTE_UNITS`) fixes the unit, so a view's sizes share one (``format_bytes(512 * KiB, "MiB")``
    is ``'0.50 MiB'``)."""
    unit = unit or byte_unit(num_bytes)
    if unit not in BYTE_UNITS:
        raise ValueError(f"unit: unknown {unit!r}; choose one of {', '.join(BYTE_UNITS)}.")
    value = float(num_bytes) / BYTE_UNITS[unit]
    return f"{value:.0f} B" if unit == "B" else f"{value:.2f} {unit}"  # below 1024 in its own unit: no separator


def plural(count: float, noun: str, plural_noun: str | None = None) -> str:
    """``count`` with its noun, thousands separated: ``plural(1, "array") == '1 array'``,
    ``plural(1024, "rank") == '1,024 ranks'``, ``plural(2, "axis", "axes") == '2 axes'``."""
    word = noun if count == 1 else (plural_noun or noun + "s")
    return f"{format_number(count)} {word}"


def format_seconds(seconds: float) -> str:
    """A time in the unit that reads, to 3 significant digits below a minute: ``'850 µs'``, ``'12.3 ms'``,
    ``'358 ms'``, ``'25.6 s'``, ``'2 min 05 s'``, ``'1 h 02 min'``; a missing time is :data:`MISSING`."""
    if _missing(seconds):
        return MISSING
    s = float(seconds)
    if s < 0:
        return "-" + format_seconds(-s)
    if s >= 3600 - 30:
        minutes = int(round(s / 60))
        return f"{minutes // 60} h {minutes % 60:02d} min"
    if s >= 60 - 0.05:
        whole = int(round(s))
        return f"{whole // 60} min {whole % 60:02d} s"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if s >= scale * 0.9995 or unit == "µs":
            return f"{_significant(s / scale, 3)} {unit}"
    raise AssertionError("unreachable")


def format_count(count: float, digits: int = 3) -> str:
    """A large count shortened with K, M, B, T (thousands, millions, billions, trillions) to ``digits``
    significant digits: ``format_count(20_576) == '20.6K'``, ``format_count(44_400_000) == '44.4M'``,
    ``format_count(8.03e9) == '8.03B'``; below 1,000 the count itself (``'950'``)."""
    if _missing(count):
        return MISSING
    value = float(count)
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= scale * (1 - 0.5 * 10 ** -digits):
            text = _significant(value / scale, digits)
            return f"{text.rstrip('0').rstrip('.') if '.' in text else text}{suffix}"
    return format_number(value, digits)


def format_params(count: float) -> str:
    """A parameter count for a title: ``'20.6K parameters'``, ``'44.4M parameters'``, ``'8.03B parameters'``."""
    return f"{format_count(count)} {'parameter' if count == 1 else 'parameters'}"


def format_number(value, digits: int = 3) -> str:
    """A table cell: whole numbers in full with thousands separators (``'1,005,617,024'``, also for a
    float that is whole), other numbers to ``digits`` significant digits (``'1.00'``, ``'177'``,
    ``'0.0123'``), None and NaN as :data:`MISSING`, anything else as ``str``."""
    if _missing(value):
        return MISSING
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        return str(value)
    x = float(value)
    if math.isinf(x):
        return "∞" if x > 0 else "-∞"
    if x == int(x):
        return f"{int(x):,}"
    return _significant(x, digits)


def format_column(values, digits: int = 4) -> list[str]:
    """A table column's numbers with one number of decimals, so they line up and compare: whole numbers in
    full with thousands separators, others to ``digits`` significant digits of the largest
    (``[1.0, 1.002965] -> ['1.000', '1.003']``, ``[959.03, 25595.5] -> ['959', '25,596']``); None and NaN as
    :data:`MISSING`; a value that is not a number as ``str``."""
    numbers = [float(v) for v in values if not _missing(v) and not isinstance(v, (bool, str)) and _is_number(v)]
    finite = [x for x in numbers if math.isfinite(x)]
    if any(finite) and max(abs(x) for x in finite) < TINY:  # a column of tiny numbers: each a power of ten
        return [format_number(v) if _missing(v) or isinstance(v, (bool, str)) or not _is_number(v)
                or not math.isfinite(float(v)) else _significant(float(v), digits - 1) for v in values]
    if all(x == int(x) for x in finite):
        decimals = 0
    else:
        top = max(abs(x) for x in finite if x) if any(finite) else 1.0
        decimals = max(0, digits - 1 - int(math.floor(math.log10(top))))
    out = []
    for v in values:
        if _missing(v) or isinstance(v, (bool, str)) or not _is_number(v) or not math.isfinite(float(v)):
            out.append(format_number(v))
        else:
            out.append(f"{float(v):,.{decimals}f}")
    return out


def _is_number(value) -> bool:
    try:
        float(value)
        return True
    except (TypeError, ValueError):
        return False


#: Below this magnitude a number is written as a power of ten (``'4.77 × 10⁻⁷'``): ``'0.000000477'`` makes a
#: reader count zeros.
TINY = 1e-4
_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def _power_of_ten(x: float, digits: int) -> str:
    mantissa, exponent = f"{x:.{digits - 1}e}".split("e")
    return f"{mantissa} × 10{str(int(exponent)).translate(_SUPERSCRIPT)}"


def _significant(x: float, digits: int) -> str:
    """``x`` to ``digits`` significant digits, thousands separated, never in e-notation (below :data:`TINY`, as a
    power of ten)."""
    x = float(f"{x:.{digits}g}")  # rounded first: 0.9996 is '1.00', not '1.000'
    if x == 0:
        return "0"
    if abs(x) < TINY:
        return _power_of_ten(x, digits)
    decimals = max(0, digits - 1 - int(math.floor(math.log10(abs(x)))))
    return f"{x:,.{decimals}f}"


def _missing(value) -> bool:
    """None, NaN, and pandas' NA and NaT (``value != value``, or a comparison that refuses a truth value)."""
    if value is None or isinstance(value, str):
        return value is None
    try:
        return bool(value != value)
    except (TypeError, ValueError):
        return str(value) in ("<NA>", "NaT")


def readable(summary: dict, digits: int = 4) -> dict:
    """A summary as a reader wants it: ``*_bytes`` values formatted (``"112.00 MiB"``), other floats to
    ``digits`` significant digits, everything else unchanged (``readable(plan.summary())``)."""
    out = {}
    for key, value in summary.items():
        if key.endswith("_bytes") and isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = format_bytes(value)
        elif isinstance(value, float):
            out[key] = float(f"{value:.{digits}g}")
        else:
            out[key] = value
    return out

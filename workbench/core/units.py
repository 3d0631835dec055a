"""Byte units and their formatting. Sizes in this package are bytes unless a name says otherwise."""

from __future__ import annotations

KiB = 2**10
MiB = 2**20
GiB = 2**30


def format_bytes(num_bytes: float) -> str:
    """Format a byte count with binary prefixes: ``format_bytes(3 * MiB) == '3.00 MiB'``."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


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

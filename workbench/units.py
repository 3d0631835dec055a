"""Byte units and their formatting. Sizes in this package are bytes unless a name says otherwise."""

from __future__ import annotations

KiB = 2**10
MiB = 2**20
GiB = 2**30


def format_bytes(num_bytes: float) -> str:
    """Format a byte count with binary prefixes: ``format_bytes(3 * 2**20) == '3.00 MiB'``."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")

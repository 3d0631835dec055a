"""A measured quantity as a line in the micro-batch size: activation bytes, compute seconds (issue 26).

A model's profile (:mod:`workbench.runs.profile`) measures forward and backward at a few micro-batch
sizes b. Every activation the backward keeps is ``b`` sequences of something, and the compute is ``b``
times the work of one, so both are fitted as ``intercept + slope * b`` by least squares: the intercept
holds what does not grow with ``b`` (a causal mask, the weight gradients' temporaries, a kernel's fixed
cost), and the residual says how far the points are from the line. Pure: standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True, kw_only=True)
class LinearFit:
    """``y = intercept + slope * x``, fitted to ``num_points`` points.

    Attributes:
        intercept: ``y`` at ``x = 0``, in ``y``'s unit.
        slope: ``y`` per unit of ``x``.
        max_residual: Largest ``|y - fit(x)|`` over the points, in ``y``'s unit (0 for two points).
        num_points: Points fitted (at least two distinct ``x``).
        x_min: Smallest ``x`` fitted. x_max: Largest ``x`` fitted (beyond them, :meth:`at` extrapolates).
    """

    intercept: float
    slope: float
    max_residual: float
    num_points: int
    x_min: float
    x_max: float

    def at(self, x: float) -> float:
        """The line at ``x``."""
        return self.intercept + self.slope * x

    def extrapolates(self, x: float) -> bool:
        """Whether ``x`` lies outside the fitted points' range."""
        return not self.x_min <= x <= self.x_max

    def to_dict(self) -> dict:
        return {"intercept": self.intercept, "slope": self.slope, "max_residual": self.max_residual,
                "num_points": self.num_points, "x_min": self.x_min, "x_max": self.x_max}


def fit_linear(xs: Sequence[float], ys: Sequence[float], *, what: str = "y") -> LinearFit:
    """Least-squares line through ``(xs[i], ys[i])`` (two points: the line through them).

    Args:
        xs: The micro-batch sizes (or any abscissa), at least two distinct values.
        ys: The measurements, one per ``x``, finite.
        what: Names the measured quantity in errors (e.g. ``"activation_bytes"``).

    Raises:
        ValueError: naming ``what``: lengths differ, fewer than two distinct ``x``, or a value not finite.
    """
    if len(xs) != len(ys):
        raise ValueError(f"{what}: {len(ys)} values for {len(xs)} micro-batch sizes")
    points = [(float(x), float(y)) for x, y in zip(xs, ys)]
    bad = [p for p in points if not (math.isfinite(p[0]) and math.isfinite(p[1]))]
    if bad:
        raise ValueError(f"{what}: values must be finite, got {bad[0]}")
    if len({x for x, _ in points}) < 2:
        raise ValueError(f"{what}: a line needs two or more distinct micro-batch sizes, got "
                         f"{sorted({x for x, _ in points})}")
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)
    intercept = mean_y - slope * mean_x
    residual = max(abs(y - (intercept + slope * x)) for x, y in points)
    return LinearFit(intercept=intercept, slope=slope, max_residual=residual, num_points=n,
                     x_min=min(x for x, _ in points), x_max=max(x for x, _ in points))


def fit_from_dict(data: dict, *, what: str) -> LinearFit:
    """A :class:`LinearFit` back from :meth:`LinearFit.to_dict` (``ValueError`` naming ``what`` if a field is
    missing or not a finite number)."""
    fields = ("intercept", "slope", "max_residual", "num_points", "x_min", "x_max")
    if not isinstance(data, dict) or set(data) != set(fields):
        raise ValueError(f"{what}: must hold exactly {', '.join(fields)}")
    for name in fields:
        value = data[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{what}.{name}={value!r}: must be a finite number")
    return LinearFit(**{name: (int(data[name]) if name == "num_points" else float(data[name])) for name in fields})

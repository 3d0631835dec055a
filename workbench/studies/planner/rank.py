"""The ranking of priced plans and the line that says why each ranks where it does (issue 27).

Plans that fit (with the safety margin) come first, fastest first (ties: the smaller peak, then the larger
buckets' fewer collectives); the rest follow, smallest peak first. The recommendation is the first: the
fastest plan that fits. Pure arithmetic on :class:`~workbench.studies.planner.candidates.Candidate` s.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from workbench.core.units import format_bytes
from workbench.estimate.step_time import TERMS
from workbench.strategies import get_strategy
from workbench.studies.planner.candidates import Candidate

#: A term's name in a reason.
TERM_WORDS = {"compute": "compute", "update": "update", "collectives": "collectives", "per_bucket": "per-bucket cost",
              "overhead": "step overhead"}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if abs(seconds) < 10 else f"{seconds:.1f} s"


def rank_candidates(candidates: Sequence[Candidate], memory_bytes: int, safety_margin: float) -> list[Candidate]:
    """``candidates`` ranked (``rank`` 1 is the recommendation where any plan fits), each with its reason."""
    fitting = sorted((c for c in candidates if c.fits),
                     key=lambda c: (round(c.predicted_step_s, 9), c.predicted_peak_bytes, -c.spec.communication_size))
    rest = sorted((c for c in candidates if not c.fits), key=lambda c: (c.predicted_peak_bytes, c.predicted_step_s))
    pick = fitting[0] if fitting else None
    ranked = []
    for i, c in enumerate([*fitting, *rest], 1):
        ranked.append(replace(c, rank=i, reason=explain(c, pick, memory_bytes, safety_margin)))
    return ranked


def explain(c: Candidate, pick: Candidate | None, memory_bytes: int, safety_margin: float) -> str:
    """One line: why ``c`` ranks where it does beside ``pick`` (the recommendation; None when nothing fits)."""
    extra = f"; flat pads {c.flat_padding:.0%}" if c.flat_padding >= 0.005 else ""
    allowed = memory_bytes / (1 + safety_margin)
    if not c.fits:
        strategy = "DDP" if get_strategy(c.spec.strategy).family == "data_parallel" else c.spec.strategy
        if c.predicted_peak_bytes > memory_bytes:
            return (f"{strategy} does not fit: {format_bytes(c.predicted_peak_bytes)} > {format_bytes(memory_bytes)}"
                    + extra)
        return (f"{strategy} is within the budget but not its {safety_margin:.0%} safety margin: "
                f"{format_bytes(c.predicted_peak_bytes)} > {format_bytes(allowed)}" + extra)
    spare = f"{format_bytes(c.headroom_bytes)} to spare of {format_bytes(memory_bytes)}"
    if c is pick or pick is None:
        return f"the pick: fastest plan that fits with the {safety_margin:.0%} margin ({spare})" + extra
    slower = c.predicted_step_s - pick.predicted_step_s
    if slower <= 1e-12:
        more = c.predicted_peak_bytes - pick.predicted_peak_bytes
        return ("ties the pick: the same predicted time and peak" if more == 0 else
                f"as fast as the pick, {format_bytes(more)} more memory") + extra
    deltas = {t: c.step.term_s(t) - pick.step.term_s(t) for t in TERMS}
    worst = max(deltas, key=deltas.get)
    why = f"{TERM_WORDS[worst]} +{_ms(deltas[worst])}"
    if worst in ("collectives", "per_bucket") and c.step.num_collectives != pick.step.num_collectives:
        why += f" ({c.step.num_collectives} collectives, the pick {pick.step.num_collectives})"
    elif worst == "compute" and c.spec.num_microbatches != pick.spec.num_microbatches:
        why += f" ({c.spec.num_microbatches} micro-batches of {c.spec.micro_batch_size})"
    return f"{_ms(slower)} ({slower / pick.predicted_step_s:.0%}) slower than the pick: {why}" + extra

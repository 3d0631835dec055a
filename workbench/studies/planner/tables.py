"""The plan advisor's tables for a notebook or the deck (issue 27): the ranked plans, and the validated ones.

Plain pandas frames of what :func:`~workbench.studies.planner.advise.advise_plan` and
:func:`~workbench.studies.planner.validate.validate_plan` returned; every number is theirs, rounded for reading.
"""

from __future__ import annotations

import pandas as pd

from workbench.core.units import MiB


def advice_table(advice, *, top: int | None = 12) -> pd.DataFrame:
    """The first ``top`` ranked plans (all with None) and each strategy's best plan beyond them: rank, plan,
    predicted peak MiB per rank, fits, headroom MiB, predicted step ms, tokens/s and why."""
    shown = list(advice.candidates if top is None else advice.candidates[:top])
    for c in advice.candidates[len(shown):]:
        if all(c.spec.strategy != s.spec.strategy for s in shown):
            shown.append(c)
    return pd.DataFrame([{"rank": c.rank, "plan": c.label, "peak MiB": round(c.predicted_peak_bytes / MiB, 1),
                          "fits": c.fits, "headroom MiB": round(c.headroom_bytes / MiB, 1),
                          "step ms": round(c.predicted_step_s * 1e3, 2), "tokens/s": round(c.tokens_per_s),
                          "why": c.reason} for c in shown]).set_index("rank")


def validation_table(validation) -> pd.DataFrame:
    """Predicted against measured per validated plan: step ms and peak MiB, their errors, and the terms off."""
    rows = []
    for v in validation.runs:
        c = v.candidate
        rows.append({"role": v.role, "plan": c.label,
                     "step ms predicted": round(c.predicted_step_s * 1e3, 2),
                     "step ms measured": None if v.measured_step_s is None else round(v.measured_step_s * 1e3, 2),
                     "step error": None if v.step_error is None else f"{v.step_error:+.0%}",
                     "noise ms": None if v.noise_s is None else round(v.noise_s * 1e3, 2),
                     "peak MiB predicted": round(c.predicted_peak_bytes / MiB, 1),
                     "peak MiB measured": None if v.measured_peak_bytes is None
                     else round(v.measured_peak_bytes / MiB, 1),
                     "peak error": None if v.peak_error is None else f"{v.peak_error:+.0%}",
                     "off": "; ".join(v.off) or ("within 10%" if v.status == "done" else f"not measured: {v.status}"),
                     "run": v.run_id})
    return pd.DataFrame(rows).set_index("role")


def order_line(validation) -> str:
    """The predicted and measured orders of the validated plans, whether they agree, whether the pick measured
    fastest, and, repeated, whether it is faster than the runner-up, within noise of it, or slower."""
    against = validation.pick_against_runner_up
    return (f"predicted order: {', '.join(validation.predicted_order)}; measured: "
            f"{', '.join(validation.measured_order or ['-'])}; agree: {validation.order_agrees}; "
            f"pick measured fastest: {validation.pick_measured_fastest}"
            + (f"; the pick against the runner-up, repeated: {against}" if against else ""))


def strategy_table(advice) -> pd.DataFrame:
    """Per strategy: its smallest predicted peak per rank (MiB, and the plan), whether any of its plans fits, and
    its fastest fitting plan's step (ms): memory per strategy for this model, ranks and batch."""
    rows = {}
    for c in advice.candidates:
        row = rows.setdefault(c.spec.strategy, {"strategy": c.spec.strategy, "smallest peak MiB": None,
                                                "smallest plan": None, "fits": False, "fastest fitting ms": None})
        if row["smallest peak MiB"] is None or c.predicted_peak_bytes / MiB < row["smallest peak MiB"]:
            row["smallest peak MiB"], row["smallest plan"] = round(c.predicted_peak_bytes / MiB, 1), c.label
        if c.fits and (row["fastest fitting ms"] is None or c.predicted_step_s * 1e3 < row["fastest fitting ms"]):
            row["fits"], row["fastest fitting ms"] = True, round(c.predicted_step_s * 1e3, 2)
    return pd.DataFrame(list(rows.values())).set_index("strategy")

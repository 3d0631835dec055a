"""The memory model against measurement, per run and rank (notebooks 03, 05 and 06).

:func:`memory_validation` compares :func:`workbench.runs.estimate.estimate_run_memory` with what
the ranks measured (every run record holds it):

* ``parameters`` and ``optimizer_state``: bytes of the live arrays on the rank (MLX arrays; the
  JAX device's shards). Target: within :data:`COMPONENT_TOLERANCE`.
* ``peak``: MLX's ``mx.get_peak_memory`` over the run (its allocator's high-water mark of array
  bytes); JAX on CPU has no allocator statistics, so its ``peak`` is the rank's ``truth_peak`` (one more
  step's arguments + how far it raised ``VmHWM``: :data:`workbench.ranks.probes.TRUTH_SOURCE`), with XLA's
  buffer plan of the step beside it (``plan_bytes``). A run recorded before ranks read the truth shows the
  plan, with no target (the plan is an estimate too). Target: within :data:`PEAK_TOLERANCE` for runs of the
  built-in LM (a user model's activations are its logits only in the estimate: its peak is reported, not
  held; notebook 07 holds it to the prediction made from its profile). Where a held peak misses, ``cause``
  names the term that is off (:func:`peak_cause`): the estimate's phases against XLA's schedule, or what the
  rank held beyond XLA's plan.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.estimate.breakdown import MemoryEstimate
from workbench.runs.estimate import estimate_run_memory, spec_from_row
from workbench.strategies import get_strategy
from workbench.views.tables import worst_rows

if TYPE_CHECKING:
    import pandas as pd

#: Largest relative error allowed for parameters and optimizer state.
COMPONENT_TOLERANCE = 0.05
#: Largest relative error allowed for a peak (MLX's allocator mark; a JAX rank's truth).
PEAK_TOLERANCE = 0.10


def predicted_components(estimate: MemoryEstimate) -> dict[str, int]:
    """The estimate in the terms a rank can measure: parameters, optimizer state (with master
    weights and the flat layout's padding, which lives in the sharded state), and the peak."""
    padding = estimate["flat_padding"] if get_strategy(estimate.strategy).family == "zero_1_2" else 0
    return {"parameters": estimate["parameters"],
            "optimizer_state": estimate["optimizer_state"] + estimate["master_weights"] + padding,
            "peak": estimate.total_bytes}


def memory_validation(loaded) -> "pd.DataFrame":
    """Predicted against measured memory, one row per (done run, rank, component).

    Args:
        loaded: :func:`workbench.runs.tables.load_runs` output.

    Returns:
        Columns ``run``, ``run_id``, ``framework``, ``strategy``, ``rank``, ``component``
        (``parameters``, ``optimizer_state``, ``peak``), ``predicted_bytes``, ``measured_bytes``,
        ``ratio`` (measured / predicted; a JAX peak that is XLA's plan against :func:`in_plan_bytes`),
        ``tolerance`` (None where no target applies: a user model's peak, a JAX peak that is XLA's plan),
        ``within`` (bool or None), ``source`` (how it was measured),
        ``plan_bytes`` (XLA's plan of the step; NaN for MLX and for parameters and state) and ``cause``
        (a missed target's term, :func:`peak_cause`; "" otherwise). Runs recorded before measurements were
        stored contribute no rows.
    """
    import pandas as pd

    rows = []
    runs = loaded.runs
    done = runs[runs.status == "done"] if "status" in runs else runs.iloc[0:0]
    for _, run in done.iterrows():
        spec = spec_from_row(run)
        # a user model's shapes are in its record ("model_shapes"), stored by the driver that built it
        estimate = estimate_run_memory(spec, run.get("model_shapes"))
        predicted = predicted_components(estimate)
        for rank in run.get("summary.ranks") or []:
            measured = rank.get("measured_memory")
            if not measured:
                continue
            for component, want in predicted.items():
                got, source, plan = measured.get(component), "live arrays", None
                if component == "peak":
                    got, source, plan = measured_peak(measured)
                    if is_plan(source):  # XLA's plan, shown beside what of the estimate a plan can hold
                        want = in_plan_bytes(estimate)
                if got is None:
                    continue
                # A user model's activations are modelled by its logits only (runs.estimate): its peak is shown,
                # not held; so is a JAX peak that is XLA's plan (a run recorded before its ranks read the truth).
                held = spec.get("model_factory") is None and not is_plan(source)
                tolerance = (PEAK_TOLERANCE if held else None) if component == "peak" else COMPONENT_TOLERANCE
                ratio = got / want if want else float("nan")
                within = None if tolerance is None else bool(abs(ratio - 1) <= tolerance)
                rows.append({
                    "run": f"{spec['framework']} {spec['strategy']}", "run_id": run.run_id,
                    "framework": spec["framework"], "strategy": spec["strategy"], "rank": rank.get("rank"),
                    "component": component, "predicted_bytes": int(want), "measured_bytes": int(got), "ratio": ratio,
                    "tolerance": tolerance, "within": within, "source": source, "plan_bytes": plan,
                    "cause": peak_cause(estimate, got, plan, tolerance) if within is False and component == "peak"
                    else "",
                })
    columns = ["run", "run_id", "framework", "strategy", "rank", "component", "predicted_bytes", "measured_bytes",
               "ratio", "tolerance", "within", "source", "plan_bytes", "cause"]
    return pd.DataFrame(rows, columns=columns)


def measured_peak(measured: dict) -> tuple[int | None, str, int | None]:
    """A rank's measured peak, how it was read, and XLA's plan of its step (JAX; None for MLX): the truth where
    the rank read it, else what it stored as ``peak`` (MLX's allocator mark, or, for a JAX run recorded before
    ranks read the truth, the plan itself)."""
    plan = measured.get("peak") if is_plan(measured.get("peak_source", "")) else None
    if measured.get("truth_peak") is not None:
        return measured["truth_peak"], measured.get("truth_source", "VmHWM"), plan
    return measured.get("peak"), measured.get("peak_source", "live arrays"), plan


def is_plan(source: str) -> bool:
    """Whether a peak read as ``source`` is XLA's buffer plan of the step (a JAX rank's ``peak_source``), an
    estimate shown beside the measurement rather than a measurement."""
    return source.startswith("XLA")


def highest_peak(ranks: list[dict]) -> tuple[int, str, int | None] | None:
    """A run's peak: its highest rank's :func:`measured_peak` among the ranks that read the truth, where any did
    (else among those whose stored peak is XLA's plan); None where no rank stored one."""
    peaks = [m for m in (measured_peak(r.get("measured_memory") or {}) for r in ranks) if m[0] is not None]
    peaks = [m for m in peaks if not is_plan(m[1])] or peaks
    return max(peaks, key=lambda m: m[0]) if peaks else None


def judge_peak(estimate: MemoryEstimate, peak: int, source: str, plan: int | None) -> tuple[int, bool | None, str]:
    """``(predicted, within, cause)`` of a measured peak: held to :data:`PEAK_TOLERANCE` of the estimate, a miss's
    term named (:func:`peak_cause`); a peak that is XLA's plan is shown beside :func:`in_plan_bytes`, not held."""
    if is_plan(source):
        return in_plan_bytes(estimate), None, ""
    within = abs(peak / estimate.total_bytes - 1) <= PEAK_TOLERANCE
    return estimate.total_bytes, within, "" if within else peak_cause(estimate, peak, plan, PEAK_TOLERANCE)


def in_plan_bytes(estimate: MemoryEstimate) -> int:
    """The estimate's peak less what no compiled program's plan holds: the collective library's scratch
    (``collective_scratch``, XLA's CPU reduce-scatter over gloo) where the backward phase sets the peak."""
    return estimate.total_bytes - (estimate["collective_scratch"] if estimate.peak_phase == "backward" else 0)


def source_label(source: str) -> str:
    """A peak's ``source`` in a table's few words: ``XLA plan``, ``VmHWM`` (a JAX rank's truth), or MLX's
    ``mx.get_peak_memory``."""
    return "XLA plan" if is_plan(source) else "VmHWM" if "VmHWM" in source else source


def peak_cause(estimate: MemoryEstimate, measured: int, plan: int | None, tolerance: float) -> str:
    """Which term of the estimate a missed peak points at. With XLA's plan of the step (JAX): the plan against
    the estimate (the estimate's phases against XLA's schedule, which frees and reuses buffers the phases keep,
    or keeps some at once that the phases part), and the measured peak against the plan (above it: buffers the
    rank held outside the compiled program, gloo's: XLA's CPU reduce-scatter copies its whole input into a buffer
    of its own; below it: the mark did not rise by all of the plan's buffers). Without a plan (MLX): the
    estimate's peak phase."""
    total = estimate.total_bytes
    phase = estimate.peak_phase
    rows = ", ".join(c.name.replace("_", " ") for c in estimate.components
                     if c.rank_bytes and c.phase == phase and c.name != "collective_scratch")
    if plan is None:
        return f"the estimate's {phase} phase ({rows}): measured {measured / total:.2f} of the estimate"
    # the collective library's scratch is outside XLA's program: the plan is held to the rest of the estimate,
    # the rank to the plan with the scratch beside it
    in_plan = in_plan_bytes(estimate)
    scratch = total - in_plan
    causes = []
    if abs(plan / in_plan - 1) > tolerance:
        causes.append(f"XLA's plan of the step is {plan / in_plan:.2f} of the estimate: its schedule "
                      f"{'holds less' if plan < in_plan else 'holds more'} than the estimate's {phase} phase ({rows})")
    if abs(measured / (plan + scratch) - 1) > tolerance:
        outside = ("buffers outside the compiled step" + (" beyond the estimate's collective scratch" if scratch
                   else ": gloo's, such as the copy of its whole input XLA's CPU reduce-scatter makes")) \
            if measured > plan + scratch else \
            "the mark did not rise by all of the plan's buffers: some sat in memory the process already held"
        causes.append(f"the rank held {measured / (plan + scratch) - 1:+.0%} against XLA's plan"
                      + (" and the collective scratch" if scratch else "") + f" ({outside})")
    return "; ".join(causes) or f"the estimate and XLA's plan each within {tolerance:.0%}, their errors added"


def memory_validation_summary(table: "pd.DataFrame") -> "pd.DataFrame":
    """Per strategy and component, its worst row (:func:`~workbench.views.tables.worst_rows`): the worst
    |ratio - 1|, its tolerance, whether it is within, and its ``cause`` (:func:`peak_cause`; "" where it is
    within or has no target)."""
    import pandas as pd

    columns = ["framework", "strategy", "component", "worst_error", "tolerance", "within", "cause"]
    if table.empty:
        return pd.DataFrame(columns=columns)
    worst = worst_rows(table, ["framework", "strategy", "component"])
    out = worst.rename(columns={"error": "worst_error"}).sort_values(["framework", "strategy", "component"])
    if "cause" not in out:
        out = out.assign(cause="")
    out["within"] = [None if pd.isna(tol) else bool(err <= tol) for err, tol in zip(out.worst_error, out.tolerance)]
    return out[columns].reset_index(drop=True)

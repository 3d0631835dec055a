"""Notebook 07's measured profile of the user's model, and each run's peak held against the prediction from it.

:func:`profile_your_model` measures each framework's profile of the model once
(:func:`workbench.launch.profile.profile_model`, cached beside the runs) and :func:`profile_table` shows it with what
it cost; :func:`peak_table` holds each run's measured peak against the prediction made from that profile
(:func:`workbench.runs.profile_estimate.estimate_with_profile`), and names a missed peak's term or why a run is shown
and not held.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from workbench.core.units import byte_unit, format_bytes, format_seconds
from workbench.runs.estimate import spec_from_row
from workbench.runs.profile_estimate import estimate_with_profile
from workbench.runs.tables import LoadResult
from workbench.studies.memory import highest_peak, is_plan, judge_peak

if TYPE_CHECKING:
    import pandas as pd

    from workbench.runs.profile import ModelProfile
    from workbench.studies.your_model import YourModel

#: Why a JAX run's peak is shown, not held: recorded before its ranks read their truth, it is XLA's plan.
JAX_PEAK_CAUSE = "stored peak is XLA's buffer plan, not a measurement (recorded before ranks read VmHWM)"


def profile_your_model(model: YourModel, runs_root: Any, **kwargs: Any) -> dict[str, "ModelProfile"]:
    """Each framework's profile of ``model`` (:func:`~workbench.launch.profile.profile_model` of its first run:
    measured once on one process, then read from ``<runs_root>/.profiles``); ``{}`` for a model without runs."""
    from workbench.launch.profile import profile_model

    firsts = {}
    for spec in model.run_specs:
        firsts.setdefault(spec.framework, spec)
    return {fw: profile_model(spec, runs_root, **kwargs) for fw, spec in firsts.items()}


def profile_table(profiles: Mapping[str, "ModelProfile"], micro_batch: int, num_ranks: int = 1) -> "pd.DataFrame":
    """Each framework's profile, one column per framework: the sizes measured, activations per sequence and at
    the runs' ``micro_batch`` as a rank of ``num_ranks`` holds them (a JAX rank of two or more: the one-device truth
    scaled by XLA's plan on a mesh, :meth:`~workbench.runs.profile.ModelProfile.activation_fit_for`, the line the
    peaks are predicted from), forward and backward at it, the optimizer update, how the peak was read, and what
    profiling cost (wall seconds; the profiling process's peak resident memory)."""
    import pandas as pd

    rank = f", a rank of {num_ranks}" if num_ranks > 1 else ""
    rows = {fw: {"sequences measured": ", ".join(map(str, p.micro_batch_sizes)),
                 f"activations per sequence{rank}": format_bytes(p.activation_fit_for(num_ranks).slope),
                 f"activations at {micro_batch} sequences{rank}": format_bytes(p.activation_bytes_at(micro_batch,
                                                                                                     num_ranks)),
                 f"forward and backward at {micro_batch} sequences": format_seconds(p.compute_s_at(micro_batch)),
                 "optimizer update": format_seconds(p.update_s), "peak read as": p.truth_source.split(",")[0],
                 "profile cost": format_seconds(p.cost_s), "profile memory": format_bytes(p.cost_peak_rss_bytes)}
            for fw, p in profiles.items()}
    return pd.DataFrame(rows)


def peak_table(loaded: LoadResult, profiles: Mapping[str, "ModelProfile"]) -> "pd.DataFrame":
    """Each done run's largest measured peak over its ranks against the peak predicted from its framework's
    profile: ``run``, ``framework``, ``predicted_bytes``, ``measured_bytes`` (MLX's allocator mark; a JAX rank's
    truth, :func:`~workbench.studies.memory.measured_peak`), ``ratio``, ``within``
    (:data:`~workbench.studies.memory.PEAK_TOLERANCE`; None where the stored peak is XLA's plan, not a
    measurement) and ``cause`` (why a run is not held, or a missed peak's term:
    :func:`~workbench.studies.memory.peak_cause`)."""
    import pandas as pd

    rows = []
    runs = loaded.runs
    for _, run in runs[runs.status == "done"].iterrows() if "status" in runs else ():
        spec = spec_from_row(run)
        highest = highest_peak(run.get("summary.ranks") or [])  # the ranks that read the truth, where any did
        profile = profiles.get(spec["framework"])
        if highest is None or profile is None:
            continue
        estimate = estimate_with_profile(spec, profile, run.get("model_shapes"))
        peak, source, plan = highest
        # a run recorded before its JAX ranks read the truth: its plan beside what of the estimate a plan can hold
        predicted, within, cause = judge_peak(estimate, peak, source, plan)
        rows.append({"run": f"{spec['framework']} {spec['strategy']}", "framework": spec["framework"],
                     "predicted_bytes": int(predicted), "measured_bytes": int(peak), "ratio": peak / predicted,
                     "within": within, "cause": JAX_PEAK_CAUSE if is_plan(source) else cause})
    return pd.DataFrame(rows, columns=["run", "framework", "predicted_bytes", "measured_bytes", "ratio", "within",
                                       "cause"])


def peak_display(table: "pd.DataFrame") -> "pd.DataFrame":
    """:func:`peak_table` as a reader reads it: bytes in one unit, the ratio to 2 decimals, the verdict in words."""
    verdict = {True: "within 10%", False: "outside 10%"}
    unit = byte_unit(table.measured_bytes.max()) if len(table) else "B"  # one unit for the whole table
    return table.assign(predicted=[format_bytes(b, unit) for b in table.predicted_bytes],
                        measured=[format_bytes(b, unit) for b in table.measured_bytes], ratio=table.ratio.map("{:.2f}".format),
                        held=[verdict.get(w, "shown, not held") for w in table.within]
                        )[["run", "predicted", "measured", "ratio", "held", "cause"]].set_index("run")


def states_display(validation: "pd.DataFrame") -> "pd.DataFrame":
    """Per run, measured / predicted of parameters and optimizer state (the worst rank), to 3 decimals, from
    :func:`~workbench.studies.memory.memory_validation`."""
    states = validation[validation.component != "peak"]
    worst = states.assign(error=(states.ratio - 1).abs()).sort_values("error").groupby(["run", "component"]).last()
    table = worst.ratio.unstack("component").map("{:.3f}".format)
    return table.rename(columns={"parameters": "parameters, measured / predicted",
                                 "optimizer_state": "optimizer state, measured / predicted"})

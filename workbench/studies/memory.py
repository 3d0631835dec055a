"""The memory model against measurement, per run and rank (notebooks 03, 05 and 06).

:func:`memory_validation` compares :func:`workbench.runs.estimate.estimate_run_memory` with what
the ranks measured (every run record holds it):

* ``parameters`` and ``optimizer_state``: bytes of the live arrays on the rank (MLX arrays; the
  JAX device's shards). Target: within :data:`COMPONENT_TOLERANCE`.
* ``peak``: MLX's ``mx.get_peak_memory`` over the run (its allocator's high-water mark of array
  bytes); JAX on CPU has no allocator statistics, so its ``peak`` is XLA's buffer plan of the
  compiled step (arguments + outputs + temporaries). Target: within :data:`PEAK_TOLERANCE`
  for MLX runs of the built-in LM (a user model's activations are its logits only in the estimate:
  its peak is reported, not held). XLA's plan reuses output buffers for gradients where it can, which a closed formula
  does not follow: the JAX peak is reported, with its ratio, but not held to the target.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.estimate.breakdown import MemoryEstimate
from workbench.runs.estimate import estimate_run_memory, spec_from_row
from workbench.strategies import get_strategy

if TYPE_CHECKING:
    import pandas as pd

#: Largest relative error allowed for parameters and optimizer state.
COMPONENT_TOLERANCE = 0.05
#: Largest relative error allowed for MLX's peak.
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
        ``ratio`` (measured / predicted), ``tolerance`` (None where no target applies: the JAX
        peak), ``within`` (bool or None) and ``source`` (how it was measured). Runs recorded
        before measurements were stored contribute no rows.
    """
    import pandas as pd

    rows = []
    runs = loaded.runs
    done = runs[runs.status == "done"] if "status" in runs else runs.iloc[0:0]
    for _, run in done.iterrows():
        spec = spec_from_row(run)
        # a user model's shapes are in its record ("model_shapes"), stored by the driver that built it
        predicted = predicted_components(estimate_run_memory(spec, run.get("model_shapes")))
        for rank in run.get("summary.ranks") or []:
            measured = rank.get("measured_memory")
            if not measured:
                continue
            for component, want in predicted.items():
                got = measured.get(component)
                if got is None:
                    continue
                # A user model's activations are modelled by its logits only (runs.estimate): its peak is shown, not held.
                held = spec["framework"] == "mlx" and spec.get("model_factory") is None
                tolerance = (PEAK_TOLERANCE if held else None) if component == "peak" else COMPONENT_TOLERANCE
                ratio = got / want if want else float("nan")
                rows.append({
                    "run": f"{spec['framework']} {spec['strategy']}", "run_id": run.run_id,
                    "framework": spec["framework"], "strategy": spec["strategy"], "rank": rank.get("rank"),
                    "component": component, "predicted_bytes": int(want), "measured_bytes": int(got), "ratio": ratio,
                    "tolerance": tolerance, "within": None if tolerance is None else bool(abs(ratio - 1) <= tolerance),
                    "source": measured.get("peak_source", "live arrays") if component == "peak" else "live arrays",
                })
    columns = ["run", "run_id", "framework", "strategy", "rank", "component", "predicted_bytes", "measured_bytes",
               "ratio", "tolerance", "within", "source"]
    return pd.DataFrame(rows, columns=columns)


def memory_validation_summary(table: "pd.DataFrame") -> "pd.DataFrame":
    """Per strategy and component: the worst |ratio - 1| over ranks and runs, and whether all are within target."""
    import pandas as pd

    if table.empty:
        return pd.DataFrame(columns=["framework", "strategy", "component", "worst_error", "tolerance", "within"])
    t = table.assign(error=(table.ratio - 1).abs())
    g = t.groupby(["framework", "strategy", "component"], sort=True)
    out = g.agg(worst_error=("error", "max"), tolerance=("tolerance", "first")).reset_index()
    out["within"] = [None if pd.isna(tol) else bool(err <= tol) for err, tol in zip(out.worst_error, out.tolerance)]
    return out

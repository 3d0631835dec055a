"""Gradient accumulation on real runs: what G micro-batches per step cost in collectives, bytes,
step time and memory, with the sync deferred to the last micro-batch or done after every one.

The NeMo pattern (``MoEFSDPSyncMixin.prepare_for_grad_accumulation`` /
``prepare_for_final_backward``): a naive FSDP step reduce-scatters every micro-batch's gradient
(and, with full sharding, gathers every unit again for every micro-batch); the deferred step
accumulates local gradients and synchronises once. Deferral saves collectives and bytes and
pays in memory: the accumulator is unsharded, and under full sharding the gathered weights stay
for the whole loop (:func:`workbench.estimate.memory.estimate_memory`, ``num_microbatches``/``defer_sync``).

* :func:`accumulation_specs` -- the sweep: G = 1 once, and each G > 1 in both modes.
* :func:`expected_collectives` / :func:`expected_bytes` -- the model of one step's collectives
  per rank, by kind, from the run's bucket plan and units (what the trainers must issue).
* :func:`accumulation_table` -- per run: collectives counted by the ranks against the model,
  bytes, median step and sync time, measured peak against the memory model, loss difference to
  the G = 1 run of the same framework and strategy.
* :func:`fig_accumulation` -- the trade-off against G, one line per strategy and mode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import plotly.graph_objects as go

from workbench.runs.estimate import estimate_run_memory, run_step_shape, spec_from_row
from workbench.strategies import COLLECTIVE_KINDS, StepShape, get_strategy, strategies
from workbench.studies.memory import highest_peak, judge_peak, source_label
from workbench.studies.runs import loss_curves
from workbench.studies.step_time import steady_median
from workbench.views.style import coincide_note, figure, separate_coinciding, subplot_grid

if TYPE_CHECKING:
    import pandas as pd

KINDS = COLLECTIVE_KINDS  # (workbench.strategies)
MODES = {True: "deferred", False: "every micro-batch"}


def accumulation_specs(base: Mapping[str, Any], *, frameworks: Sequence[str], strategies: Sequence[str],
                       microbatches: Iterable[int]) -> list:
    """RunSpecs of the sweep: every framework x strategy at G = 1, and at each G > 1 deferred and not.

    ``base`` holds the other RunSpec fields; ``global_batch`` must divide by ``num_ranks * G``
    for every G (the RunSpec says which does not).
    """
    from workbench.runs.spec import RunSpec

    out = []
    for f in frameworks:
        for s in strategies:
            for g in microbatches:
                for defer in ((True,) if g == 1 else (True, False)):
                    out.append(RunSpec(**{**base, "framework": f, "strategy": s, "num_microbatches": g,
                                          "defer_sync": defer}))
    return out


def _fields(spec: Any) -> dict:
    """The spec's fields, validated (a RunSpec or its dict; a bad field raises, naming it), defaults filled."""
    from dataclasses import asdict

    from workbench.runs.spec import RunSpec

    return asdict(spec if isinstance(spec, RunSpec) else RunSpec(**spec))


def step_shape(spec: Any) -> StepShape:
    """What one optimizer step of ``spec``'s run syncs and gathers, for its strategy's record: the run
    estimate's :func:`~workbench.runs.estimate.run_step_shape` of the validated spec (defaults filled).

    The sync collectives are what the framework's implementation issues per sync: MLX's buckets at
    ``communication_size`` (JAX's FSDP step uses the same plan), JAX DDP's arrays, or a unit-gathering
    strategy's units. MLX runs always compute the global norm (one all-reduce under the sharded
    strategies); JAX only when ``max_norm`` is set. These are the collectives the step asks for; a
    compiler may combine or merge some (JAX: ``compiled_collectives``).
    """
    return run_step_shape(_fields(spec))


def expected_collectives(spec: Any) -> dict[str, int]:
    """Collectives one rank issues in one optimizer step, by kind (:data:`KINDS`): the strategy
    record's count (:meth:`workbench.strategies.Strategy.step_collectives`) for :func:`step_shape`."""
    return get_strategy(_fields(spec)["strategy"]).collective_counts(step_shape(spec))


def expected_bytes(spec: Any) -> int:
    """Bytes one rank sends per optimizer step on a ring (gradients and parameters; the norm's
    4 bytes left out), by the record's bus factors: all-reduce 2(N-1)/N of the data, reduce-scatter
    and all-gather (N-1)/N."""
    return get_strategy(_fields(spec)["strategy"]).bytes_sent(step_shape(spec))


def mode_label(spec: Any) -> str:
    """``"G = 1"``, ``"deferred"`` or ``"every micro-batch"``."""
    f = _fields(spec)
    return MODES[f["defer_sync"]] if f["num_microbatches"] > 1 else "G = 1"


def accumulation_model_table(specs: Iterable[Any]) -> "pd.DataFrame":
    """The model of each spec before any run: collectives by kind and MiB sent per rank per step, the
    memory model's accumulator, gathered unit, backward and step phases, peak, and which phase sets it."""
    import pandas as pd

    rows = []
    for spec in specs:
        est = estimate_run_memory(_fields(spec))
        f = _fields(spec)
        rows.append({"framework": f["framework"], "strategy": f["strategy"], "G": f["num_microbatches"],
                     "mode": mode_label(f), **expected_collectives(f), "MiB sent": expected_bytes(f) / 2**20,
                     "accumulator MiB": est["gradient_accumulator"] / 2**20, "gathered MiB": est["gathered_unit"] / 2**20,
                     "backward MiB": est.phase_bytes("backward") / 2**20, "step MiB": est.phase_bytes("step") / 2**20,
                     "peak MiB (model)": est.total_bytes / 2**20, "peak set by": est.peak_phase})
    return pd.DataFrame(rows)


def accumulation_table(loaded) -> "pd.DataFrame":
    """One row per done run of :func:`workbench.runs.tables.load_runs` output.

    Columns: ``framework``, ``strategy``, ``G``, ``mode``, ``collectives`` (per step, all kinds, as
    the ranks' steps issue them: every rank must report the same), ``expected_collectives``,
    ``compiled_collectives`` (JAX: those XLA kept in the compiled step, which combines all-reduces
    and merges repeated gathers; MLX: None), ``counted`` and ``expected`` (by kind, dicts),
    ``mib_sent`` (model, per rank per step), ``step_ms`` and ``sync_ms`` (median after warm-up of
    the slowest rank; sync: MLX only), ``peak_mib`` (largest measured over ranks: MLX's allocator mark, a JAX
    rank's truth, :func:`~workbench.studies.memory.measured_peak`), ``model_peak_mib``, ``peak_ratio``,
    ``peak_source``, ``plan_mib`` (XLA's plan of that rank's step; JAX only), ``peak_within`` and
    ``peak_cause`` (:func:`~workbench.studies.memory.judge_peak`: None and "" for a JAX run stored with its plan
    only, whose ``model_peak_mib`` is then what of the model a plan can hold), ``max_loss_diff`` and
    ``max_grad_norm_rel_diff`` (to the G = 1 run whose spec
    is otherwise the same; the norm is of the averaged gradient, so a mis-scaled accumulation
    shows there even where AdamW's update hides it), ``run_id``.
    """
    import pandas as pd

    runs, curves, rows = loaded.runs, loss_curves(loaded), []
    done = runs[runs.status == "done"]
    for _, run in done.iterrows():
        fields = _fields(spec_from_row(run))
        steps = loaded.steps[loaded.steps.run_id == run.run_id]
        ranks = run["summary.ranks"]
        counted = {k: int(ranks[0].get("collectives", {}).get(k, 0)) for k in KINDS}
        if any({k: int(r.get("collectives", {}).get(k, 0)) for k in KINDS} != counted for r in ranks):
            raise ValueError(f"run {run.run_id}: ranks report different collectives: "
                             f"{[r.get('collectives') for r in ranks]}")
        compiled = ranks[0].get("compiled_collectives")
        # the highest rank's peak: MLX's allocator mark, a JAX rank's truth (VmHWM) beside XLA's plan of its step
        peak, source, plan = highest_peak(ranks) or (None, "", None)
        estimate = estimate_run_memory(fields)
        model_peak, within, cause = judge_peak(estimate, peak, source, plan) if peak is not None else \
            (estimate.total_bytes, None, "")
        rows.append({
            "framework": fields["framework"], "strategy": fields["strategy"], "G": fields["num_microbatches"],
            "mode": mode_label(fields),
            "collectives": sum(counted.values()), "expected_collectives": sum(expected_collectives(fields).values()),
            "compiled_collectives": sum(compiled.values()) if compiled else None,
            "counted": counted, "expected": expected_collectives(fields),
            "mib_sent": expected_bytes(fields) / 2**20,
            "step_ms": _ms(steady_median(steps, "step_time_s")), "sync_ms": _ms(steady_median(steps, "sync_time_s")),
            "peak_mib": peak / 2**20 if peak is not None else None, "model_peak_mib": model_peak / 2**20,
            "peak_ratio": peak / model_peak if peak is not None else None, "peak_source": source_label(source),
            "plan_mib": plan / 2**20 if plan is not None else None, "peak_within": within,
            "peak_cause": cause,
            "run_id": run.run_id,
            "_key": repr(sorted((k, v) for k, v in fields.items() if k not in ("num_microbatches", "defer_sync"))),
        })
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    table["max_loss_diff"] = [_diff_to_g1(curves, table, row, "loss") for _, row in table.iterrows()]
    table["max_grad_norm_rel_diff"] = [_diff_to_g1(curves, table, row, "grad_norm", relative=True)
                                       for _, row in table.iterrows()]
    order = ["framework", "strategy", "G", "mode"]
    return table.drop(columns="_key").sort_values(order, key=lambda c: c.map(str) if c.name != "G" else c).reset_index(drop=True)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def _diff_to_g1(curves: "pd.DataFrame", table: "pd.DataFrame", row: "pd.Series", column: str, *,
                relative: bool = False) -> float | None:
    """Largest |value - value of the G = 1 run with the same spec otherwise| over steps (``column``:
    ``loss`` or ``grad_norm``, the global norm before clipping; ``relative``: divided by the G = 1 value)."""
    ref = table[(table._key == row._key) & (table.G == 1)]
    if ref.empty:
        return None
    mine = curves[curves.run_id == row.run_id].set_index("step")[column]
    other = curves[curves.run_id == ref.run_id.iloc[0]].set_index("step")[column]
    a, b = mine.align(other, join="inner")
    diff = (a - b).abs() / (b.abs() if relative else 1)
    return float(diff.max()) if len(a) else None


#: One colour per runnable strategy, the same in every figure whatever else is registered.
STRATEGY_COLORS = {"ddp": "#4C78A8", "fsdp-row": "#F58518", "fsdp-flat": "#54A24B", "fsdp-full": "#B279A2",
                   "mlx-fully-shard": "#E45756", "hsdp-row": "#72B7B2"}


def fig_accumulation(table: "pd.DataFrame", framework: str = "mlx", *, height: int = 620) -> go.Figure:
    """Four panels against G: collectives per step, MiB sent per rank per step, median step time,
    peak memory per rank (measured: markers and lines; the memory model: dotted). One colour per
    strategy; solid deferred, dashed every micro-batch (G = 1 starts both lines)."""
    t = table[table.framework == framework] if len(table) else table
    layout, refs = subplot_grid(2, 2, ["collectives per step (counted)", "MiB sent per rank per step (model)",
                                "median step time (ms)", "peak MiB per rank (dotted: model)"])
    for k, (xaxis, _) in enumerate(refs):
        layout["xaxis" + xaxis[1:]].update(type="log", dtick=0.30103, **(
            {"title": dict(text="G, micro-batches per step")} if k >= 2 else {}))
    runnable = [r.name for r in strategies() if r.frameworks]
    colors = {name: STRATEGY_COLORS.get(name, "#9D9D9D") for name in runnable}
    traces = []
    for strategy in [s for s in runnable if len(t) and s in set(t.strategy)]:
        for defer, dash in ((True, "solid"), (False, "dash")):
            part = t[(t.strategy == strategy) & ((t.G == 1) | (t["mode"] == MODES[defer]))].sort_values("G")
            if len(part) < 2:
                continue
            name = f"{strategy}, {MODES[defer]}"
            for k, col in enumerate(("collectives", "mib_sent", "step_ms", "peak_mib")):
                traces.append(dict(type="scatter", x=part.G.tolist(), y=part[col].tolist(), mode="lines+markers",
                                   name=name, legendgroup=name, showlegend=k == 0, xaxis=refs[k][0], yaxis=refs[k][1],
                                   line=dict(color=colors[strategy], dash=dash)))
            traces.append(dict(type="scatter", x=part.G.tolist(), y=part.model_peak_mib.tolist(), mode="lines",
                               name=f"{name} (model)", legendgroup=name, showlegend=False, xaxis=refs[3][0],
                               yaxis=refs[3][1], line=dict(color=colors[strategy], dash="dot", width=1)))
    title = f"Gradient accumulation in {framework.upper()}: deferred sync against sync every micro-batch"
    notes = coincide_note(separate_coinciding(traces))  # lines on each other are said, and drawn wide to narrow
    if notes:  # the title sits mid top margin: two title lines of margin per note keep it above the panels' titles
        layout["margin"] = dict(l=60, r=20, t=80 + 36 * len(notes), b=60)
        title += "".join(f"<br><sup>{note}</sup>" for note in notes)
    return figure(traces, layout, title, height + 36 * len(notes))

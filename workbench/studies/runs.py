"""Stored runs as tables and figures: convergence curves, differences to DDP, step time and memory.

Everything here reads what :func:`workbench.runs.tables.load_runs` returns, so a notebook can
redraw any figure from disk without rerunning. Ranks take equal slices of the global batch,
so the mean of the ranks' losses at a step is the global loss; a step ends when its slowest
rank ends, so a step's time is the maximum over ranks.
"""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go

from workbench.runs.labels import run_labels
from workbench.strategies import get_strategy
from workbench.core.units import format_number
from workbench.views.style import TEMPLATE, coincide_note, coinciding, separate_coinciding, subplot_grid

#: Steps left out of step-time medians: the first steps compile and allocate (every step is kept where a run
#: has no more than these).
WARMUP_STEPS = 2


def after_warmup(per_step):
    """The steps of ``per_step`` (a Series or DataFrame indexed by step, one run's) after
    :data:`WARMUP_STEPS`; all of them where the run has no more than the warm-up. The one warm-up selection:
    :func:`summarize_runs` and :func:`workbench.studies.step_time.steady_steps` both call it."""
    return per_step[per_step.index >= WARMUP_STEPS] if len(per_step) > WARMUP_STEPS else per_step


def loss_curves(loaded) -> pd.DataFrame:
    """One row per (run, step): the global loss (mean over ranks) and the step time (max over ranks)."""
    steps = loaded.steps
    if steps.empty:
        return pd.DataFrame(columns=["run_id", "step", "loss", "grad_norm", "step_time_s"])
    g = steps.groupby(["run_id", "step"])
    return pd.DataFrame({"loss": g.loss.mean(), "grad_norm": g.grad_norm.mean(), "step_time_s": g.step_time_s.max()}).reset_index()


def _twin_fields(runs: pd.DataFrame) -> list[str]:
    """The spec fields that tell runs apart; a run's DDP twin agrees on all of them but the strategy."""
    return [c for c in runs.columns if c.startswith("spec.") and c != "spec.strategy"]


def is_ddp(strategy: str) -> bool:
    """Whether a run's strategy replicates everything (DDP: the reference every other run is held to)."""
    return get_strategy(strategy).family == "data_parallel"


def ddp_twin(runs: pd.DataFrame, run_id: str) -> str | None:
    """The DDP run with the same spec as ``run_id`` except the strategy, if stored and done."""
    runs = runs.set_index("run_id")
    me = runs.loc[run_id]
    fields = _twin_fields(runs.reset_index())
    for rid, row in runs.iterrows():
        if is_ddp(row["spec.strategy"]) and row["status"] == "done" and all(
            (pd.isna(row[f]) and pd.isna(me[f])) or row[f] == me[f] for f in fields
        ):
            return str(rid)
    return None


#: The columns of :func:`summarize_runs`, in order (an empty store gives them too).
SUMMARY_COLUMNS = ("run", "run_id", "framework", "strategy", "status", "steps", "final_loss", "median_step_ms",
                   "peak_rss_mib", "peak_array_mib", "max_abs_loss_diff_to_ddp")


def summarize_runs(loaded) -> pd.DataFrame:
    """One row per run: label, framework and strategy (read these, not the label's words), status, final loss,
    median step time, peak memory (process RSS, and MLX's array peak where recorded), and max |loss - DDP's|."""
    runs, curves = loaded.runs, loss_curves(loaded)
    labels = dict(zip(runs.run_id, run_labels(runs)))  # what sets each run apart among these
    rows = []
    for _, run in runs.iterrows():
        mine = curves[curves.run_id == run.run_id].set_index("step")
        steady = after_warmup(mine)
        steps = loaded.steps[loaded.steps.run_id == run.run_id]
        twin = run.run_id if is_ddp(run["spec.strategy"]) else ddp_twin(runs, run.run_id)
        diff = None
        if twin is not None and len(mine):
            ref = curves[curves.run_id == twin].set_index("step").loss
            both = mine.loss.align(ref, join="inner")
            diff = float((both[0] - both[1]).abs().max()) if len(both[0]) else None
        rows.append({
            "run": labels[run.run_id], "run_id": run.run_id, "framework": run["spec.framework"],
            "strategy": run["spec.strategy"], "status": run.status, "steps": len(mine),
            "final_loss": float(mine.loss.iloc[-1]) if len(mine) else None,
            "median_step_ms": float(steady.step_time_s.median() * 1e3) if len(steady) else None,
            # Process peak RSS is comparable across frameworks; MLX also reports its arrays' peak.
            "peak_rss_mib": _max_mib(steps, "peak_rss_bytes"),
            "peak_array_mib": _max_mib(steps, "peak_array_bytes"),
            "max_abs_loss_diff_to_ddp": diff,
        })
    return pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))


def _max_mib(steps: pd.DataFrame, column: str) -> float | None:
    if column not in steps or steps[column].isna().all():
        return None
    return float(steps[column].max() / 2**20)


#: Where |loss - DDP loss| = 0 is drawn on the log axis of :func:`fig_diff_to_ddp`.
DIFF_FLOOR = 1e-12

_DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")


def fig_loss_curves(loaded, floor_nats: float | None = None, *, height: int = 420) -> go.Figure:
    """Global loss against step, one line per run, with the data's entropy floor dashed.

    Runs whose curves coincide (equal to 1e-6 at every step) are said so in the subtitle, and every
    line has its own dash pattern and a width that narrows run by run, so lines drawn on top of
    each other stay distinguishable.
    """
    runs, curves = loaded.runs, loss_curves(loaded)
    labels = dict(zip(runs.run_id, run_labels(runs)))  # what sets each run apart among these
    ordered = list(runs.sort_values(["spec.framework", "spec.strategy"]).iterrows())
    ys = {labels[run.run_id]: curves[curves.run_id == run.run_id].loss.tolist() for _, run in ordered}
    groups = coinciding(ys, rtol=1e-6, floor=1.0)  # equal to 1e-6 of the loss (or of 1 nat) at every step
    note = "; ".join(f"{len(g)} runs coincide ({', '.join(g)})" for g in groups) or "no two runs coincide"
    fig = go.Figure(layout=dict(template=TEMPLATE, height=height, yaxis_title="loss (nats per token)",
                                xaxis=dict(title="step", tick0=0, dtick=max(1, -(-int(curves.step.max() if len(curves) else 1)
                                                                               // 10))),
                                title=f"Convergence: every strategy on the same global batches<br><sup>{note}</sup>"))
    for k, (_, run) in enumerate(ordered):
        c = curves[curves.run_id == run.run_id]
        fig.add_trace(go.Scatter(x=c.step.tolist(), y=c.loss.tolist(), mode="lines", name=labels[run.run_id],
                                 line=dict(dash=_DASHES[k % len(_DASHES)], width=max(1.5, 2 * len(ordered) - 2 * k))))
    if floor_nats is not None:
        fig.add_hline(y=floor_nats, line_dash="dash", line_color="black",
                      annotation_text=f"entropy rate of the data: {floor_nats:.3f} nats")
    return fig


def fig_diff_to_ddp(loaded, *, height: int = 360) -> go.Figure:
    """|loss - DDP's loss| per step for every non-DDP run that has a stored DDP twin (log scale).

    Exact zeros are drawn at :data:`DIFF_FLOOR`, the bottom of the axis, and the subtitle says how many
    runs equal DDP at every step; lines that lie on each other are said and drawn wide to narrow
    (issue 18: six identical lines showed as one, at 1e-12, with nothing saying why). The axis spans at
    least two decades, labelled at each decade.
    """
    runs, curves = loaded.runs, loss_curves(loaded)
    labels = dict(zip(runs.run_id, run_labels(runs)))  # what sets each run apart among these
    traces, exact = [], 0  # runs equal to DDP at every step
    for _, run in runs[~runs["spec.strategy"].map(is_ddp)].iterrows():
        twin = ddp_twin(runs, run.run_id)
        if twin is None:
            continue
        a = curves[curves.run_id == run.run_id].set_index("step").loss
        b = curves[curves.run_id == twin].set_index("step").loss
        d = (a - b).abs().dropna()
        exact += bool(len(d) and (d == 0).all())
        traces.append(dict(type="scatter", x=d.index.tolist(), y=d.clip(lower=DIFF_FLOOR).tolist(), mode="lines+markers",
                           name=labels[run.run_id], line=dict(width=1.5)))
    notes = coincide_note(separate_coinciding(traces))
    if exact:
        notes.insert(0, f"{exact} of {len(traces)} runs equal DDP exactly at every step (drawn at the floor, "
                        f"{DIFF_FLOOR:.0e})")
    top = max((max(t["y"]) for t in traces if t["y"]), default=DIFF_FLOOR)
    span = [math.log10(DIFF_FLOOR) - 0.5, max(math.log10(top) + 0.5, math.log10(DIFF_FLOOR) + 2)]
    title = "Difference to DDP (fp32 rounding level is ~1e-7 of the loss)" + "".join(f"<br><sup>{n}</sup>" for n in notes)
    layout = dict(template=TEMPLATE, height=height + 14 * len(notes), xaxis_title="step", margin=dict(t=70 + 14 * len(notes)),
                  yaxis=dict(title="|loss - DDP loss|", type="log", exponentformat="e", dtick=1, range=span),
                  title=title)
    return go.Figure(dict(data=traces, layout=layout))


def fig_step_time_memory(summary: pd.DataFrame, *, height: int = 360) -> go.Figure:
    """Median step time and peak process memory (RSS) per rank, per run (from :func:`summarize_runs`), as two
    panels side by side, each on its own axis from zero (one chart with two y axes gave neither whole ticks)."""
    layout, refs = subplot_grid(1, 2, ["median step after warm-up, slowest rank (ms)", "peak process memory per rank (MiB)"],
                                hspace=0.1)
    fig = go.Figure(layout=dict(template=TEMPLATE, height=height, showlegend=False, margin=dict(t=90), **layout,
                                title="Step time and peak process memory (RSS) per rank"))
    for (x, y), column, unit in zip(refs, ("median_step_ms", "peak_rss_mib"), ("ms", "MiB")):
        values = summary[column].tolist()
        fig.add_trace(go.Bar(x=summary.run.tolist(), y=values, xaxis=x, yaxis=y, name=unit,
                             text=[format_number(v) for v in values], textposition="outside", cliponaxis=False))
        fig.layout[f"yaxis{y[1:]}"].update(rangemode="tozero", title=unit)
    return fig


def _span(values) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.3g}" if f"{lo:.3g}" == f"{hi:.3g}" else f"{lo:.3g}-{hi:.3g}"


def convergence_findings(loaded, floor_nats: float | None = None) -> list[str]:
    """What the stored runs show about convergence, each sentence computed from them (issue 29: prose that
    said "the frameworks differ" stood under a figure whose subtitle said every run coincides).

    Curves coincide as :func:`fig_loss_curves` says (equal to 1e-6 of the loss, or of 1 nat, at every step).
    """
    runs, curves = loaded.runs, loss_curves(loaded)
    labels = dict(zip(runs.run_id, run_labels(runs)))
    ys = {labels[r]: curves[curves.run_id == r].loss.tolist() for r in runs.run_id}
    groups = coinciding(ys, rtol=1e-6, floor=1.0)
    out = []
    if len(groups) == 1 and len(groups[0]) == len(ys) > 1:
        out.append(f"All {len(ys)} runs draw one loss curve: equal to 1e-6 of the loss at every step, across "
                   f"strategies and frameworks.")
    else:
        for fw, ids in runs.groupby("spec.framework").run_id:
            mine = [labels[r] for r in ids]
            one = any(set(mine) <= set(g) for g in groups)
            out.append(f"{fw}: the {len(mine)} runs {'draw one curve' if one else 'do not all coincide'}.")
        ddp = {fw: curves[curves.run_id == r].set_index("step").loss
               for fw, r in runs[runs["spec.strategy"].map(is_ddp)].groupby("spec.framework").run_id.first().items()}
        if len(ddp) == 2:
            a, b = ddp.values()
            gap = float((a - b).abs().max())
            out.append(f"The frameworks' DDP runs differ by at most {gap:.2g} nats per token at any step.")
    diffs = summarize_runs(loaded)
    fsdp = diffs[~diffs.strategy.map(is_ddp)].max_abs_loss_diff_to_ddp.dropna()
    if len(fsdp):
        out.append(f"{int((fsdp == 0).sum())} of {len(fsdp)} sharded runs equal their DDP twin exactly at every step; "
                   f"the largest difference is {fsdp.max():.2g} nats.")
    final = [v[-1] for v in ys.values() if v]
    if final and floor_nats is not None:
        out.append(f"Final losses {_span(final)} nats against the data's floor of {floor_nats:.3f}.")
    return out


def cost_findings(summary: pd.DataFrame) -> list[str]:
    """Per framework, the sharded runs' median step and peak RSS against DDP's, as ratios (from
    :func:`summarize_runs`, read by its framework and strategy columns, never out of the label's words; the step
    times depend on the machine's load when they ran)."""
    out = []
    for fw, rows in summary.groupby("framework"):
        ddp = rows[rows.strategy.map(is_ddp)]
        others = rows.drop(ddp.index).dropna(subset=["median_step_ms"])
        if ddp.empty or others.empty:
            continue
        base = ddp.iloc[0]
        ratios = others.median_step_ms / base.median_step_ms
        out.append(f"{fw}: sharded steps take {_span(ratios)}x DDP's {base.median_step_ms:.3g} ms "
                   f"({_span(others.median_step_ms)} ms; slowest {others.loc[ratios.idxmax(), 'run']}); "
                   f"peak RSS {_span(others.peak_rss_mib)} MiB against DDP's {base.peak_rss_mib:.4g} MiB.")
    return out

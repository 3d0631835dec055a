"""Figures, tables and an explorer of the memory model (:mod:`workbench.estimate.memory`).

Every ``fig_*`` returns a plotly figure and never shows it; tables are pandas DataFrames. They
only draw what :func:`~workbench.estimate.memory.estimate_memory`, :func:`~workbench.estimate.cases.explain_qwen_3_7b`,
:func:`~workbench.estimate.cases.compare_estimators` and :func:`~workbench.studies.memory.memory_validation`
computed, scaled to a display unit (:data:`UNITS`); the published cases' tables are :mod:`workbench.estimate.cases`'
and the grid of estimates :mod:`workbench.estimate.grid`. A breakdown bar is the ``states`` rows plus the
rows of the transient phase that sets the peak, so its height is ``total_bytes``; the other phase,
which never coexists with it, is a tick. The explorer wires controls to
:func:`~workbench.estimate.grid.estimate_breakdowns` and :func:`fig_memory_breakdown` and computes nothing itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

import plotly.graph_objects as go

from workbench.core.units import format_count, format_number, format_params
from workbench.estimate.breakdown import COMPONENTS, PHASES, MemoryEstimate
from workbench.estimate.cases import (  # noqa: F401  (the tables: notebooks import them from here too)
    ZERO_FIGURE_1,
    ZERO_PAPER_KNOBS,
    StrategyGap,
    estimator_table,
    zero_figure_1_table,
)
from workbench.estimate.grid import estimate_breakdowns  # noqa: F401  (notebooks import it from here too)
from workbench.estimate.memory import compare_strategies
from workbench.views.style import figure, subplot_grid
from workbench.views.tables import worst_rows

if TYPE_CHECKING:
    import pandas as pd


#: Display units: name -> bytes. GB is decimal, as the ZeRO paper and mlx-lm print.
UNITS = {"GB": 10**9, "GiB": 2**30, "MB": 10**6, "MiB": 2**20}
COMPONENT_COLORS = dict(zip(COMPONENTS, (
    "#4C78A8", "#F58518", "#72B7B2", "#54A24B", "#EECA3B", "#C8C8C8",  # states
    "#FF9DA6", "#9ECAE9", "#88D27A", "#E45756", "#B279A2", "#D67195",  # step
    "#9D755D", "#BAB0AC", "#79706E", "#FCBF49")))  # backward
#: Marker of the peak, by what sets it (:func:`peak_label`).
PEAK_SYMBOLS = {"backward": "diamond", "step": "triangle-up", "states only": "circle"}

def _scale(unit: str) -> int:
    if unit not in UNITS:
        raise ValueError(f"unit: unknown {unit!r}; choose one of {', '.join(UNITS)}.")
    return UNITS[unit]


def peak_label(estimate: MemoryEstimate) -> str:
    """The phase that sets the peak (``"step"`` or ``"backward"``), or ``"states only"`` with no transients."""
    return estimate.peak_phase if estimate.total_bytes > estimate.phase_bytes("states") else "states only"


def breakdown_summary(estimates: Sequence[MemoryEstimate], unit: str = "GB") -> str:
    """The peaks at the largest N of ``estimates``, per strategy, in ``unit`` for people (``format_number``:
    "1,810,000 GB", "17.3 GB"; it read "1807076.71 GB"), with the phase that sets each."""
    scale, n = _scale(unit), max(e.num_shards for e in estimates)
    return f"N={n}: " + ", ".join(f"{e.strategy} {format_number(e.total_bytes / scale)} {unit} ({peak_label(e)})"
                                  for e in estimates if e.num_shards == n)


def over_capacity(estimates: Sequence[MemoryEstimate], capacity_bytes: float) -> list[MemoryEstimate]:
    """The estimates whose peak (``total_bytes``) exceeds ``capacity_bytes``, in their order: who does not fit.
    The one test of it: the explorer's warning (:func:`~workbench.views.memory_explorer.capacity_html`) and the
    deck's memory assumptions (:func:`~workbench.studies.deck_findings.memory_assumptions`) both ask here."""
    return [e for e in estimates if e.total_bytes > capacity_bytes]


#: The capacity line's colour, dash and width (:func:`capacity_trace`).
CAPACITY_LINE = dict(color="#B00020", dash="dash", width=2)


def capacity_trace(x: Sequence, capacity_bytes: float, *, unit: str = "GB", label: str = "device") -> dict:
    """A device's memory as a dashed line trace across the bars at ``x`` (their multicategory x, one list per
    level: strategies, then ``N=...``), drawn over them so that a bar above it shows where it crosses; in the
    legend, and on hover, as ``"<label> <capacity> <unit>"`` (``"device memory 80 GB"``). The one way a capacity
    is drawn: :func:`fig_memory_breakdown` (``capacity_bytes=``), and the memory explorer through it."""
    value, x = capacity_bytes / _scale(unit), [list(level) for level in x]
    name = f"{label} {format_number(value)} {unit}"
    return dict(type="scatter", x=x, y=[value] * len(x[0]), mode="lines", name=name, line=dict(CAPACITY_LINE),
                hovertemplate=f"{name}<extra></extra>")


def _labelled_peaks(estimates: Sequence[MemoryEstimate]) -> dict[int, str]:
    """Which peaks get a number, and where: all with at most three N per strategy, else each strategy's
    smallest and largest N (seven N side by side ran their numbers together, "159159159")."""
    chosen, by_strategy = {}, {}
    for i, e in enumerate(estimates):
        by_strategy.setdefault(e.strategy, []).append(i)
    for ks in by_strategy.values():
        ks = sorted(ks, key=lambda i: estimates[i].num_shards)
        if len(ks) <= 3:
            chosen |= {i: "top center" for i in ks}
        else:  # each number leans into its own strategy, away from the neighbour's
            chosen |= {ks[0]: "top right", ks[-1]: "top left"}
    return chosen


def fig_memory_breakdown(estimates: Sequence[MemoryEstimate], *, unit: str = "GB",
                         labels: Mapping[str, str] | None = None, title: str | None = None,
                         height: int = 460, capacity_bytes: float | None = None,
                         capacity_label: str = "device") -> go.Figure:
    """Stacked bars of per-rank memory, one bar per estimate (x: strategy, then N), one colour per component.

    A bar stacks the ``states`` rows (solid) and the rows of the phase that sets the peak
    (hatched), so it ends at ``total_bytes``, where a marker (one trace per phase, named
    ``"peak, set by <phase>"``, symbols :data:`PEAK_SYMBOLS`) gives it; a tick marks where the
    other transient phase would end (it never coexists with the first).

    Args:
        estimates: From :func:`estimate_memory` (e.g. :func:`estimate_breakdowns`).
        unit: A key of :data:`UNITS` for the y axis.
        labels: Display names of strategies (default: the strategy names).
        title: Default: the parameter count and how to read the bars.
        height: Pixels.
        capacity_bytes: A device's memory, drawn as a dashed line across the bars and named in the legend
            (``capacity_label``: whose memory it is), by :func:`capacity_trace`.

    Raises:
        ValueError: on no estimates or an unknown unit.
    """
    if not estimates:
        raise ValueError("estimates: need at least one MemoryEstimate.")
    scale, labels = _scale(unit), labels or {}
    x = [[labels.get(e.strategy, e.strategy) for e in estimates], [f"N={e.num_shards}" for e in estimates]]
    traces = []
    for name in COMPONENTS:
        y = [e[name] / scale if name in PHASES["states"] or name in PHASES[e.peak_phase] else 0.0 for e in estimates]
        if any(y):
            transient = name not in PHASES["states"]
            traces.append(dict(type="bar", x=x, y=y, name=name, marker=dict(
                color=COMPONENT_COLORS[name], line=dict(width=0), pattern=dict(shape="/" if transient else "")),
                hovertemplate=f"%{{x}}<br>{name}: %{{y:.3f}} {unit}<extra></extra>"))
    other = [e.phase_bytes("backward" if e.peak_phase == "step" else "step") for e in estimates]
    labelled = _labelled_peaks(estimates)
    for phase, symbol in PEAK_SYMBOLS.items():
        k = [i for i, e in enumerate(estimates) if peak_label(e) == phase]
        if k:
            traces.append(dict(type="scatter", x=[[x[0][i] for i in k], [x[1][i] for i in k]], mode="markers+text",
                               y=[estimates[i].total_bytes / scale for i in k], name=f"peak, set by {phase}",
                               text=[f"{estimates[i].total_bytes / scale:.3g}" if i in labelled else "" for i in k],
                               textposition=[labelled.get(i, "top center") for i in k], textfont=dict(size=11),
                               marker=dict(color="#333333", symbol=symbol, size=9),
                               hovertemplate=f"%{{x}}<br>peak %{{y:.3f}} {unit}, set by {phase}<extra></extra>"))
    traces.append(dict(type="scatter", x=x, y=[(e.phase_bytes("states") + o) / scale if o else None
                                               for e, o in zip(estimates, other)],
                       mode="markers", name="other transient phase<br>(never coexists with it)",
                       marker=dict(color="#333333", symbol="line-ew-open", size=18, line=dict(width=2)),
                       hovertemplate=f"%{{x}}<br>states + other phase: %{{y:.3f}} {unit}<extra></extra>"))
    if capacity_bytes is not None:
        traces.append(capacity_trace(x, capacity_bytes, unit=unit, label=capacity_label))
    psi = estimates[0].num_params
    some = "" if len(labelled) == len(estimates) else "; numbers at the smallest and largest N of each, hover for the rest"
    title = title or (f"Memory per rank at the peak, {format_params(psi)}<br><sup>solid: model states; "
                      f"hatched: the transient phase that sets the peak (backward or step){some}</sup>")
    # The legend sits right of the plot: below it, it covered the strategy names of the multicategory axis.
    layout = dict(barmode="stack", yaxis=dict(title=dict(text=f"{unit} per rank")), xaxis=dict(type="multicategory"),
                  legend=dict(orientation="v", x=1.02, xanchor="left", y=1, yanchor="top", traceorder="normal"),
                  margin=dict(l=60, r=20, t=80, b=40))
    return figure(traces, layout, title, height)


def fig_zero_figure_1(psi: int = 7_500_000_000, num_shards: int = 64, *, height: int = 420) -> go.Figure:
    """The ZeRO paper's Figure 1 as stacked bars, with the paper's printed numbers as markers."""
    estimates = compare_strategies(psi, num_shards, tuple(ZERO_FIGURE_1), **ZERO_PAPER_KNOBS)
    fig = fig_memory_breakdown(list(estimates.values()), labels={s: v[0] for s, v in ZERO_FIGURE_1.items()},
                               height=height, title=f"ZeRO paper, Figure 1: Psi = {format_count(psi)}, N_d = {num_shards},"
                               " K = 12 (fp32 master + Adam m, v)<br><sup>bars: workbench; circles: the paper</sup>")
    fig.add_trace(go.Scatter(x=fig.data[0].x, y=[v[2] for v in ZERO_FIGURE_1.values()], mode="markers",
                             name="paper (GB)", marker=dict(symbol="circle-open", size=14, color="#B00020")))
    return fig


def fig_qwen_gap(gap: StrategyGap, *, unit: str = "GB", height: int = 460) -> go.Figure:
    """Measured peaks of the baseline and candidate, component by component, and the gap between them.

    Left: each measured peak as the estimated components plus what the model leaves out
    (``measured - estimate``: activations, temporaries, allocator cache). Right: a waterfall from
    the baseline's measured peak, down by each component's predicted difference and the
    unexplained residual, to the candidate's measured peak.
    """
    scale = _scale(unit)
    b, c = gap.baseline, gap.candidate
    names = [n for n in COMPONENTS if b[n] or c[n]]
    layout, ((x1, y1), (x2, y2)) = subplot_grid(1, 2, ("measured peak = modelled components + unmodelled",
                                                 f"{b.strategy} - {c.strategy}, component by component"))
    x = [f"{b.strategy} (measured {gap.measured_baseline_bytes / scale:.1f})",
         f"{c.strategy} (measured {gap.measured_candidate_bytes / scale:.1f})"]
    traces = [dict(type="bar", x=x, y=[b[n] / scale, c[n] / scale], name=n, xaxis=x1, yaxis=y1,
                   marker=dict(color=COMPONENT_COLORS[n])) for n in names]
    traces.append(dict(type="bar", x=x, y=[gap.unmodelled_baseline_bytes / scale,
                                           (gap.measured_candidate_bytes - c.total_bytes) / scale],
                       name="unmodelled (activations, temporaries, cache)", xaxis=x1, yaxis=y1,
                       marker=dict(color="#DDDDDD", pattern=dict(shape="."))))
    diffs = [(n, -gap.component_difference_bytes[n]) for n in names if gap.component_difference_bytes[n]]
    steps = ([(f"{b.strategy} measured", gap.measured_baseline_bytes, "absolute")]
             + [(f"{n} (predicted)", d, "relative") for n, d in diffs]
             + [("residual (unexplained)", -gap.residual_bytes, "relative"),
                (f"{c.strategy} measured", gap.measured_candidate_bytes, "total")])
    traces.append(dict(type="waterfall", x=[s[0] for s in steps], y=[s[1] / scale for s in steps],
                       measure=[s[2] for s in steps], xaxis=x2, yaxis=y2, name="gap", showlegend=False,
                       text=[f"{s[1] / scale:+.2f}" if s[2] == "relative" else f"{s[1] / scale:.2f}" for s in steps],
                       textposition="outside", connector=dict(line=dict(color="#999999"))))
    share = gap.predicted_difference_bytes / gap.measured_difference_bytes if gap.measured_difference_bytes else 0
    title = (f"Why {b.strategy} peaks {gap.measured_difference_bytes / scale:.1f} {unit} above {c.strategy} "
             f"(N={b.num_shards}): the model explains {gap.predicted_difference_bytes / scale:.1f} {unit} "
             f"({share:.0%})<br><sup>residual {gap.residual_bytes / scale:.2f} {unit}</sup>")
    layout.update(barmode="stack", yaxis=dict(layout["yaxis"], title=dict(text=unit)),
                  yaxis2=dict(layout["yaxis2"], title=dict(text=unit)))
    return figure(traces, layout, title, height)


def _worst_rows(table: "pd.DataFrame") -> "pd.DataFrame":
    return worst_rows(table, ["run", "component"]).sort_values(["framework", "strategy"])


def fig_memory_validation(table: "pd.DataFrame", *, unit: str = "MiB", height: int = 420) -> go.Figure:
    """Measured (bars) against predicted (diamonds, with the tolerance as error bars) per run and component.

    One subplot per component (parameters, optimizer_state, peak); each run shows its worst rank
    (largest |ratio - 1|), the ratio written on the bar, its source and a missed target's cause on hover.
    Green: within target; red: outside; grey: no target (a user model's peak, or a JAX peak that is XLA's
    buffer plan).

    Args:
        table: :func:`workbench.studies.memory.memory_validation` output.

    Raises:
        ValueError: on an empty table (no done runs with measurements) or an unknown unit.
    """
    scale = _scale(unit)
    if table is None or table.empty:
        raise ValueError("table: no rows (no done runs with measurements in this store).")
    components = [c for c in ("parameters", "optimizer_state", "peak") if c in set(table.component)]
    layout, refs = subplot_grid(1, len(components), components, hspace=0.1)  # room for a long run name
    rows, traces = _worst_rows(table), []
    for k, (comp, (xr, yr)) in enumerate(zip(components, refs)):
        r = rows[rows.component == comp]
        color = ["#9D9D9D" if w is None or w != w else ("#54A24B" if w else "#E45756") for w in r.within]
        traces.append(dict(type="bar", x=r.run.tolist(), y=(r.measured_bytes / scale).tolist(), name="measured",
                           showlegend=k == 0, legendgroup="m", xaxis=xr, yaxis=yr, marker=dict(color=color),
                           text=[f"{v:.3f}" for v in r.ratio], textposition="inside", insidetextanchor="start",
                           customdata=[f"{src}<br>{cause}" if isinstance(cause, str) and cause else src
                                       for src, cause in zip(r["source"], r.get("cause", [""] * len(r)))],
                           hovertemplate=f"%{{x}}<br>measured %{{y:.3f}} {unit}<br>ratio %{{text}}<br>%{{customdata}}"
                                         "<extra></extra>"))
        tol = [0.0 if t is None or t != t else t for t in r.tolerance]
        traces.append(dict(type="scatter", x=r.run.tolist(), y=(r.predicted_bytes / scale).tolist(), mode="markers",
                           name="predicted (± tolerance)", showlegend=k == 0, legendgroup="p", xaxis=xr, yaxis=yr,
                           marker=dict(symbol="diamond", color="#333333", size=9),
                           error_y=dict(type="data", array=[p * t / scale for p, t in zip(r.predicted_bytes, tol)]),
                           hovertemplate=f"%{{x}}<br>predicted %{{y:.3f}} {unit}<extra></extra>"))
        if k == 0:
            layout["yaxis"].update(title=dict(text=unit))
    # Run names as long as "mlx mlx-fully-shard" take two tick lines: the legend goes below them.
    layout["legend"] = dict(orientation="h", yanchor="top", y=-0.32, x=0)
    layout["margin"] = dict(l=60, r=20, t=80, b=110)
    title = ("Memory model against stored runs: measured / predicted per rank (worst rank shown)"
             "<br><sup>targets: parameters and optimizer state 5%, peak 10% (JAX: VmHWM); grey: no target</sup>")
    return figure(traces, layout, title, height)



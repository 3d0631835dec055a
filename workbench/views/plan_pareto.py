"""The plan advisor's figure (issue 27): each plan's predicted peak per rank against its predicted step time.

A point per plan, coloured by strategy; the plans no other plan beats on both memory and time joined as the
Pareto front; the memory budget as a line (and the budget less the safety margin, the line a plan must keep
left of to fit); the recommendation marked. Measured points of validated plans, where given, are drawn beside
their predictions. Takes plain data (the advisor's ``to_dict`` rows), so a notebook or the deck redraws it.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import plotly.graph_objects as go

from workbench.core.units import MiB
from workbench.views.style import SERIES_COLORS, figure


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both axes (lower x and lower y, one strictly), by x."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    front, best_y = [], float("inf")
    for i in order:
        if points[i][1] < best_y:
            front.append(i)
            best_y = points[i][1]
    return front


def fig_plan_pareto(candidates: Sequence[Mapping], memory_bytes: int, *, safety_margin: float = 0.0,
                    recommended: Mapping | None = None, validated: Sequence[Mapping] = (),
                    height: int = 480) -> go.Figure:
    """Predicted peak per rank (MiB) against predicted step time (ms) of every plan.

    Args:
        candidates: Rows with ``strategy``, ``label``, ``predicted_peak_bytes``, ``predicted_step_s``, ``fits``.
        memory_bytes: The budget per rank, drawn as a vertical line.
        safety_margin: The share of the budget a plan keeps free (a dotted line at ``budget / (1 + margin)``).
        recommended: The pick's row, marked with a star.
        validated: Rows with ``measured_peak_bytes`` and ``measured_step_s`` (and the predicted fields):
            each measured point, joined to its prediction.
    """
    traces = []
    strategies = list(dict.fromkeys(c["strategy"] for c in candidates))
    for k, name in enumerate(strategies):
        rows = [c for c in candidates if c["strategy"] == name]
        traces.append(dict(
            type="scatter", mode="markers", name=name,
            x=[c["predicted_peak_bytes"] / MiB for c in rows], y=[c["predicted_step_s"] * 1e3 for c in rows],
            text=[c["label"] + ("" if c["fits"] else " (does not fit)") for c in rows],
            hovertemplate="%{text}<br>%{x:.1f} MiB, %{y:.2f} ms<extra></extra>",
            marker=dict(color=SERIES_COLORS[k % len(SERIES_COLORS)], size=7,
                        symbol=["circle" if c["fits"] else "circle-open" for c in rows])))
    pts = [(c["predicted_peak_bytes"] / MiB, c["predicted_step_s"] * 1e3) for c in candidates]
    front = pareto_front(pts)
    if front:
        traces.append(dict(type="scatter", mode="lines", name="Pareto front", line=dict(color="#888888", dash="dot"),
                           x=[pts[i][0] for i in front], y=[pts[i][1] for i in front], hoverinfo="skip"))
    for v in validated:
        if v.get("measured_step_s") is None or v.get("measured_peak_bytes") is None:
            continue
        traces.append(dict(type="scatter", mode="lines+markers", showlegend=False, hoverinfo="text",
                           text=f"{v['label']}: measured {v['measured_peak_bytes'] / MiB:.1f} MiB, "
                                f"{v['measured_step_s'] * 1e3:.2f} ms",
                           x=[v["predicted_peak_bytes"] / MiB, v["measured_peak_bytes"] / MiB],
                           y=[v["predicted_step_s"] * 1e3, v["measured_step_s"] * 1e3],
                           line=dict(color="#333333", width=1), marker=dict(symbol=["circle", "x"], size=[1, 9])))
    if validated:
        traces.append(dict(type="scatter", mode="markers", name="measured (validated plans)", x=[None], y=[None],
                           marker=dict(symbol="x", color="#333333", size=9)))
    if recommended is not None:
        traces.append(dict(type="scatter", mode="markers+text", name=f"pick: {recommended['label']}",
                           x=[recommended["predicted_peak_bytes"] / MiB], y=[recommended["predicted_step_s"] * 1e3],
                           text=["pick"], textposition="top center",
                           marker=dict(symbol="star", size=16, color="#E45756", line=dict(color="white", width=1))))
    budget = memory_bytes / MiB
    shapes = [dict(type="line", xref="x", yref="paper", x0=budget, x1=budget, y0=0, y1=1,
                   line=dict(color="#333333", width=1.5))]
    notes = [dict(x=budget, y=1, xref="x", yref="paper", text=f"budget {budget:,.1f} MiB", showarrow=False,
                  xanchor="right", yanchor="bottom", font=dict(size=11))]
    if safety_margin > 0:
        edge = budget / (1 + safety_margin)
        shapes.append(dict(type="line", xref="x", yref="paper", x0=edge, x1=edge, y0=0, y1=1,
                           line=dict(color="#333333", width=1, dash="dot")))
    layout = dict(xaxis=dict(title="predicted peak per rank (MiB)"),
                  yaxis=dict(title="predicted step time (ms)", rangemode="tozero"), shapes=shapes, annotations=notes)
    title = "Plans: memory per rank against step time (open: does not fit; dotted: the budget less its margin)"
    return figure(traces, layout, title, height)

"""The house style of every figure: template, colours, figure scaffolding, and when lines coincide.

Figure modules build traces and layouts as dicts and hand them to :func:`figure`; widgets send a new
figure to a live one with :mod:`workbench.views.widget_sync`; a parameter's kind is
:func:`workbench.core.param_kinds.param_kind`.
"""

from __future__ import annotations

import copy
import functools
from typing import Sequence

import plotly.graph_objects as go

from workbench.core.param_kinds import PARAM_KINDS

#: Toolbar buttons that upload a figure; removed from every figure (template) and display (config).
UPLOAD_BUTTONS = ("sendChartToCloud", "sendDataToCloud", "editInChartStudio")

#: The plotly config for displaying figures offline: no upload button, no logo link.
PLOT_CONFIG = {"showSendToCloud": False, "displaylogo": False,
               "modeBarButtonsToRemove": list(UPLOAD_BUTTONS)}

#: The house style, owned here rather than taken from a plotly built-in: a stored figure carries these
#: few settings (plotly_white's look), so it does not change when plotly's own templates do.
TEMPLATE = go.layout.Template(
    layout=dict(
        autotypenumbers="strict", font=dict(color="#2a3f5f"), paper_bgcolor="white", plot_bgcolor="white",
        colorway=["#636efa", "#EF553B", "#00cc96", "#ab63fa", "#FFA15A", "#19d3f3", "#FF6692", "#B6E880",
                  "#FF97FF", "#FECB52"],
        hovermode="closest", hoverlabel=dict(align="left"), title=dict(x=0.05),
        xaxis=dict(gridcolor="#EBF0F8", linecolor="#EBF0F8", zerolinecolor="#EBF0F8", zerolinewidth=2, ticks="",
                   automargin=True, title=dict(standoff=15)),
        yaxis=dict(gridcolor="#EBF0F8", linecolor="#EBF0F8", zerolinecolor="#EBF0F8", zerolinewidth=2, ticks="",
                   automargin=True, title=dict(standoff=15)),
        shapedefaults=dict(line=dict(color="#2a3f5f")),
        annotationdefaults=dict(arrowcolor="#2a3f5f", arrowhead=0, arrowwidth=1),
        # plotly.js 3 offers "Share chart..." (an upload to Plotly Cloud) unless told not to: an
        # offline tool must not offer to send a figure's data anywhere.
        modebar=dict(remove=list(UPLOAD_BUTTONS)),
    ),
    data=dict(bar=[dict(marker=dict(line=dict(color="white", width=0.5)))]),
)


#: Colour of each parameter kind (:data:`workbench.core.param_kinds.PARAM_KINDS`).
KIND_COLORS = dict(zip(PARAM_KINDS, ("#4C78A8", "#F58518", "#54A24B", "#B279A2", "#E45756", "#9D755D")))


#: Colours cycled over the arrays of a bucket in a shard map.
PARAM_COLORS = ("#4C78A8", "#F58518", "#54A24B", "#B279A2", "#E45756", "#72B7B2", "#EECA3B", "#FF9DA6", "#9D755D")


PADDING_COLOR = "#C8C8C8"


LAYOUT_COLORS = {"row": "#4C78A8", "flat": "#F58518", "greedy": "#54A24B"}


SERIES_COLORS = ("#4C78A8", "#F58518", "#54A24B", "#B279A2", "#E45756")


@functools.lru_cache(maxsize=1)
def _template() -> dict:
    return TEMPLATE.to_plotly_json()


def figure(traces: list[dict], layout: dict, title: str, height: int) -> go.Figure:
    """One figure from trace and layout dicts, with the house template, title and height."""
    base = dict(
        template=copy.deepcopy(_template()), height=height,
        title=dict(text=title, x=0.01, xanchor="left", font=dict(size=14)),
        margin=dict(l=60, r=20, t=80, b=60), legend=dict(orientation="h", yanchor="top", y=-0.18, x=0),
    )
    # Every trace and layout key here is written by this module, and validating them (which also
    # deep-copies the template) takes several times longer than building the figure; tests
    # validate every figure instead (go.Figure(fig.to_dict())).
    return go.Figure(dict(data=traces, layout={**base, **layout}), _validate=False)


def coincide(a: Sequence, b: Sequence, rtol: float, floor: float = 0.0) -> bool:
    """The one rule for "these curves coincide": the same length, and at each point equal values, or numbers
    within ``rtol`` of the larger magnitude (at least ``floor``). ``rtol=0`` asks for equality."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (x, y))
        if not (x == y or (numbers and abs(x - y) <= rtol * max(abs(x), abs(y), floor))):
            return False
    return True


def coinciding(series: dict, rtol: float, floor: float = 0.0) -> list[list]:
    """Groups of two or more keys of ``series`` whose values :func:`coincide` with the group's first."""
    groups: list[list] = []
    for key, values in series.items():
        group = next((g for g in groups if coincide(series[g[0]], values, rtol, floor)), None)
        if group is None:
            groups.append([key])
        else:
            group.append(key)
    return [g for g in groups if len(g) > 1]


#: Two drawn lines are one on screen when they agree to about 3 significant digits.
ON_SCREEN_RTOL = 1e-3


def separate_coinciding(traces: list[dict]) -> list[list[str]]:
    """Groups of drawn line traces (dicts) that lie on each other: the same axes and the same points on
    screen (:func:`coincide` at :data:`ON_SCREEN_RTOL`). Within a group each line is drawn narrower than the
    one before it, so every colour stays visible; returns the groups' trace names, for a subtitle to say
    (issue 18: lines hid others unsaid)."""
    drawn = [t for t in traces if t.get("type", "scatter") == "scatter" and "lines" in t.get("mode", "lines")
             and t.get("visible", True) is True]
    points = {k: (t.get("xaxis", "x"), t.get("yaxis", "y"), *t.get("x", ()), "|", *t.get("y", ()))
              for k, t in enumerate(drawn)}
    out = []
    for keys in coinciding(points, ON_SCREEN_RTOL):
        group = [drawn[k] for k in keys]
        base = group[0].get("line", {}).get("width", 2)
        for k, t in enumerate(group):
            t["line"] = {**t.get("line", {}), "width": base + 2 * (len(group) - 1 - k)}
        out.append([t.get("name", "") for t in group])
    return out


def coincide_note(groups: list[list[str]], width: int = 130) -> list[str]:
    """:func:`separate_coinciding`'s groups said in subtitle lines of at most ``width`` characters (a group is
    never split): ``["coincide: ddp = fsdp-row; mlx = jax"]``; none for no group."""
    lines: list[str] = []
    for k, part in enumerate(" = ".join(g) for g in groups):
        part = ("coincide: " if k == 0 else "") + part
        if lines and len(lines[-1]) + 2 + len(part) <= width:
            lines[-1] += "; " + part
        else:
            lines.append(part)
    return lines


def subplot_grid(rows: int, cols: int, titles: Sequence[str], hspace: float = 0.08, vspace: float = 0.12):
    """Axes of a rows x cols grid (as ``make_subplots`` lays it out, without its cost).

    Returns ``(layout, refs)``: layout holds the axes and subplot-title annotations;
    ``refs[k]`` is the ``(xaxis, yaxis)`` pair of cell ``k`` in row-major order.
    """
    width = (1 - hspace * (cols - 1)) / cols
    height = (1 - vspace * (rows - 1)) / rows
    layout, refs, annotations = {}, [], []
    for k in range(rows * cols):
        r, c = divmod(k, cols)
        suffix = "" if k == 0 else str(k + 1)
        x0, y1 = c * (width + hspace), 1 - r * (height + vspace)
        layout[f"xaxis{suffix}"] = dict(domain=[max(x0, 0.0), min(x0 + width, 1.0)], anchor=f"y{suffix}")
        layout[f"yaxis{suffix}"] = dict(domain=[max(y1 - height, 0.0), min(y1, 1.0)], anchor=f"x{suffix}")  # no -1e-17
        refs.append((f"x{suffix}", f"y{suffix}"))
        if k < len(titles):
            annotations.append(dict(text=titles[k], x=x0 + width / 2, y=y1, xref="paper", yref="paper",
                                    xanchor="center", yanchor="bottom", showarrow=False, font=dict(size=12)))
    layout["annotations"] = annotations
    return layout, refs


def hline(y: float, xref: str, yref: str, name: str, dash: str = "dot") -> dict:
    """A horizontal line shape at ``y`` across the subplot of axes ``(xref, yref)``."""
    ref = "x domain" if xref == "x" else f"{xref} domain"
    return dict(type="line", name=name, xref=ref, x0=0, x1=1, yref=yref, y0=y, y1=y,
                line=dict(color="#333333", width=1, dash=dash))


def path_span(paths: Sequence[str]) -> str:
    """A hover label for consecutive arrays: the one path, or the count with the first and last."""
    return paths[0] if len(paths) == 1 else f"{len(paths)} arrays: {paths[0]} … {paths[-1]}"

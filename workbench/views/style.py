"""The house style of every figure: template, colours, the kind of a parameter, and figure scaffolding.

Figure modules build traces and layouts as dicts and hand them to :func:`figure`; widgets swap a
new figure into a live one with :func:`update_figure_widget`, or send only what changed with
:func:`sync_figure_widget`.
"""

from __future__ import annotations

import copy
import functools
import re
from typing import Sequence

import plotly.graph_objects as go

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


#: Colour of each parameter kind (see :func:`param_kind`).
KIND_COLORS = {
    "embedding": "#4C78A8", "attention": "#F58518", "mlp": "#54A24B",
    "expert": "#B279A2", "norm": "#E45756", "other": "#9D755D",
}


#: Colours cycled over the arrays of a bucket in a shard map.
PARAM_COLORS = ("#4C78A8", "#F58518", "#54A24B", "#B279A2", "#E45756", "#72B7B2", "#EECA3B", "#FF9DA6", "#9D755D")


PADDING_COLOR = "#C8C8C8"


LAYOUT_COLORS = {"row": "#4C78A8", "flat": "#F58518", "greedy": "#54A24B"}


SERIES_COLORS = ("#4C78A8", "#F58518", "#54A24B", "#B279A2", "#E45756")


_KIND_RULES = (
    ("expert", re.compile(r"(^|\.)experts?\.")),
    ("norm", re.compile(r"norm|(^|\.)ln_")),
    ("embedding", re.compile(r"embed|(^|\.)(wte|wpe)\.|lm_head")),
    ("attention", re.compile(r"attn|attention|(^|\.)[qkvo]_proj\.|(^|\.)w[qkvo]\.")),
    ("mlp", re.compile(r"mlp|feed_forward|ffn|moe|(^|\.)(gate|up|down)_proj\.|(^|\.)(w[123]|c_fc|c_proj)\.")),
)


PARAM_KINDS = tuple(KIND_COLORS)


@functools.lru_cache(maxsize=1 << 16)
def param_kind(path: str) -> str:
    """The kind of a parameter from its path: embedding, attention, mlp, expert, norm or other.

    Routed experts win over everything (``...experts.3.w1.weight`` is ``"expert"``);
    norms win over their block (``self_attn.q_norm.weight`` is ``"norm"``).
    """
    lowered = path.lower()
    for kind, pattern in _KIND_RULES:
        if pattern.search(lowered):
            return kind
    return "other"


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


def _on_screen(values) -> tuple:
    """Values as a line is drawn: to 3 significant digits (closer than that, two lines are one on screen)."""
    return tuple(float(f"{v:.3g}") if isinstance(v, (int, float)) else v for v in values)


def separate_coinciding(traces: list[dict]) -> list[list[str]]:
    """Groups of drawn line traces (dicts) that lie on each other: the same axes and the same points on
    screen. Within a group each line is drawn narrower than the one before it, so every colour stays
    visible; returns the groups' trace names, for a subtitle to say (issue 18: lines hid others unsaid)."""
    groups: dict[tuple, list[dict]] = {}
    for t in traces:
        if t.get("type", "scatter") == "scatter" and "lines" in t.get("mode", "lines") and t.get("visible", True) is True:
            key = (t.get("xaxis", "x"), t.get("yaxis", "y"), _on_screen(t.get("x", ())), _on_screen(t.get("y", ())))
            groups.setdefault(key, []).append(t)
    out = []
    for group in (g for g in groups.values() if len(g) > 1):
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


def update_figure_widget(fw: go.FigureWidget, shown: dict, stale_keys: set[str]) -> None:
    """Replace the traces and layout of ``fw`` by ``shown`` (figure JSON, as :func:`widget_json` gives).

    ``stale_keys`` are the layout keys the previous figure set; those ``shown`` lacks are
    cleared, since a layout update merges. The template is set once, when the widget
    is made (every figure uses :data:`~workbench.views.style.TEMPLATE`).
    """
    # Each of these is one redraw in the browser: the layout goes to the emptied plot, so only adding
    # the traces draws them (the other order drew every trace twice).
    fw.data = []
    fw.update_layout({**{key: None for key in stale_keys - set(shown["layout"])}, **shown["layout"]}, overwrite=True)
    fw.add_traces(shown["data"])


def _arrays(value):
    """Figure JSON with plotly's typed arrays (``{"dtype", "bdata", "shape"}``, what ``to_plotly_json`` writes
    for NumPy data) back as lists: set on a widget as they are, they would stay dicts in its traces. Not as
    NumPy arrays: plotly.js then holds typed arrays, reports them back in its trace deltas as ``{"0": ..}``
    objects, and plotly's handler of those raised in the kernel after every update (a traceback each)."""
    import base64

    import numpy as np

    if isinstance(value, dict):
        if "bdata" in value and "dtype" in value:
            array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
            shape = value.get("shape")
            return (array.reshape([int(n) for n in str(shape).split(",")]) if shape else array).tolist()
        return {key: _arrays(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_arrays(v) for v in value]
    return value.tolist() if isinstance(value, np.ndarray) else value  # (object arrays stay arrays in that JSON)


def _changed(old: dict, new: dict) -> dict:
    """The top-level keys of ``new`` that differ from ``old``, and ``None`` for those ``new`` dropped."""
    return {**{key: None for key in old.keys() - new.keys()},
            **{key: value for key, value in new.items() if key not in old or old[key] != value}}


def widget_json(fig: go.Figure) -> dict:
    """What :func:`sync_figure_widget` compares: ``fig``'s JSON, arrays as arrays, without the template."""
    new = _arrays(fig.to_plotly_json())
    new["layout"].pop("template", None)  # set once, when the widget is made
    return new


#: A trace that draws nothing (nor in the legend): it holds a slot of its type in a widget (see :func:`_padded`).
PLACEHOLDER = {"visible": False}


def _runs(data: Sequence[dict]) -> list[tuple[str, int]]:
    """The trace types of ``data`` as runs: ``[("bar", 4), ("scatter", 1)]``."""
    runs: list[tuple[str, int]] = []
    for trace in data:
        kind = trace.get("type", "scatter")
        if runs and runs[-1][0] == kind:
            runs[-1] = (kind, runs[-1][1] + 1)
        else:
            runs.append((kind, 1))
    return runs


def _padded(new: list[dict], slots: Sequence[tuple[str, int]]) -> list[dict]:
    """``new`` with hidden :data:`PLACEHOLDER` traces at the end of each run of one trace type, so that each
    run is as long as in ``slots`` (runs as :func:`_runs` gives them; when both have the same runs of types):
    a widget's traces keep their types and one ``Plotly.update`` draws the new figure (a model with one more
    parameter kind replaced every trace, three redraws). A longer run of ``new`` stays as it is."""
    runs = _runs(new)
    if [kind for kind, _ in runs] != [kind for kind, _ in slots]:
        return new
    out, start = [], 0
    for (kind, count), (_, wanted) in zip(runs, slots):
        out += new[start:start + count] + [{"type": kind, **PLACEHOLDER} for _ in range(wanted - count)]
        start += count
    return out


def sync_figure_widget(fw: go.FigureWidget, fig: go.Figure, shown: dict | None,
                       slots: Sequence[tuple[str, int]] = ()) -> dict:
    """Make ``fw`` show ``fig``, sending only what differs from ``shown`` (what the last call put there).

    The same traces (count and types): the changed top-level properties of each trace and of the
    layout go in one ``Plotly.update`` (one redraw in the browser, where replacing every trace cost
    three: delete, add, relayout). Runs of one trace type shorter than ``fw``'s are padded with hidden
    traces (:func:`_padded`), so another model's figure is an update too. An unchanged figure sends
    nothing. Otherwise, as :func:`update_figure_widget`. Returns what ``fw`` now shows, for the next call.
    ``slots``: the runs of trace types (``[("bar", 9), ("scatter", 2)]``) a first draw reserves, so that even
    the first figure with more traces of a kind is an update.
    """
    new = widget_json(fig)
    new["data"] = _padded(new["data"], _runs(shown["data"]) if shown else slots)
    if shown is None or [t.get("type") for t in shown["data"]] != [t.get("type") for t in new["data"]]:
        update_figure_widget(fw, new, set(shown["layout"]) if shown else set())
        return new
    edits = [_changed(old, trace) for old, trace in zip(shown["data"], new["data"])]
    layout = _changed(shown["layout"], new["layout"])
    if any(edits) or layout:
        with fw.batch_update():
            for trace, edit in zip(fw.data, edits):
                if edit:
                    trace.update(edit, overwrite=True)
            if layout:
                fw.update_layout(layout, overwrite=True)
    return new


def path_span(paths: Sequence[str]) -> str:
    """A hover label for consecutive arrays: the one path, or the count with the first and last."""
    return paths[0] if len(paths) == 1 else f"{len(paths)} arrays: {paths[0]} … {paths[-1]}"

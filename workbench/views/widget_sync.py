"""A live figure widget shown a new figure: sending only what changed, or swapping traces and layout.

:func:`sync_figure_widget` compares figure JSON (:func:`widget_json`, typed arrays decoded by
:func:`decode_typed_array`) with what the widget shows and sends one ``Plotly.update``; otherwise
:func:`update_figure_widget` replaces everything. An explorer's figures follow the notebook's width (:class:`WidthProbe`) and
show a busy cue while they redraw (:func:`busy`).
"""

from __future__ import annotations

import base64
import contextlib
import html
import time
from typing import Iterator, Mapping, Sequence

import anywidget
import ipywidgets as widgets
import numpy as np
import plotly.graph_objects as go
import traitlets

from workbench.views.figure_widget import FigureWidget


def decode_typed_array(spec: dict) -> np.ndarray:
    """The array a plotly typed-array spec (``{"dtype": "f8", "bdata": ..., "shape": "2, 3"}``) holds: what
    ``to_plotly_json`` writes for NumPy data."""
    array = np.frombuffer(base64.b64decode(spec["bdata"]), dtype=np.dtype(spec["dtype"]))
    shape = spec.get("shape")
    return array.reshape([int(n) for n in str(shape).split(",")]) if shape else array


def update_figure_widget(fw: go.FigureWidget, shown: dict, stale_keys: set[str]) -> None:
    """Replace the traces and layout of ``fw`` by ``shown`` (figure JSON, as :func:`widget_json` gives).

    ``stale_keys`` are the layout keys the previous figure set; those ``shown`` lacks are
    cleared, since a layout update merges. The template is set once, when the widget
    is made (every figure uses :data:`workbench.views.style.TEMPLATE`).
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
    if isinstance(value, dict):
        if "bdata" in value and "dtype" in value:
            return decode_typed_array(value).tolist()
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


#: Class an explorer carries while it recomputes and redraws (:func:`busy`); the probe's CSS dims its figures.
BUSY_CLASS = "workbench-busy"
#: What the status line says from a control's event until the explorer has redrawn.
BUSY_TEXT = "<i>updating…</i>"


#: Seconds from the width probe's first report (the page drew the explorer) until a figure that plotly's widget
#: code has not reported drawing counts as not drawn.
DRAW_GRACE_S = 15.0


class WidthProbe(anywidget.AnyWidget):
    """A strip of no height as wide as the explorer that holds it: the browser reports its width in pixels
    (``width``, 0 until drawn), so that figures follow the notebook's width (issue 29 item 3: fixed 940 px
    figures were clipped at a 1024 px window). It also carries the CSS of the busy cue (:data:`BUSY_CLASS`)."""

    _esm = """
export default { render({ model, el }) {
  el.style.width = "100%"; el.style.height = "0px";
  let timer = null;
  const send = () => { const w = Math.floor(el.getBoundingClientRect().width);
    if (w > 0 && w !== model.get("width")) { model.set("width", w); model.save_changes(); } };
  const seen = new ResizeObserver(() => { clearTimeout(timer); timer = setTimeout(send, 120); });
  seen.observe(el);
  // Past the draw grace, ask the kernel to look: a figure anywidget gave up on is then drawn again in a new
  // widget, or named, at once, not at the next control change. The grace starts again after each redraw.
  let check = null;
  const ask = () => { model.set("checks", (model.get("checks") || 0) + 1); model.save_changes(); };
  const later = () => { clearTimeout(check); check = setTimeout(ask, CHECK_MS); };
  later();
  model.on("change:redraws", later);
  return () => { seen.disconnect(); clearTimeout(timer); clearTimeout(check); model.off("change:redraws", later); };
} };""".replace("CHECK_MS", str(int((DRAW_GRACE_S + 5) * 1000)))
    _css = f".{BUSY_CLASS} .js-plotly-plot {{ opacity: 0.45; transition: opacity 60ms; }}"
    width = traitlets.Int(0).tag(sync=True)
    #: How often the page asked the explorer to look for undrawn figures (:data:`DRAW_GRACE_S` + 5 s after it drew
    #: the probe, and as long after each of ``redraws``); an explorer observes it beside ``width``.
    checks = traitlets.Int(0).tag(sync=True)
    #: How many times the explorer gave its undrawn figures new widgets (:func:`redraw_undrawn`); the page asks
    #: again :data:`DRAW_GRACE_S` + 5 s after each.
    redraws = traitlets.Int(0).tag(sync=True)
    #: ``time.monotonic()`` of the last redraw; None before any.
    redrawn_at: float | None = None
    #: ``time.monotonic()`` when the browser first reported a width (a live page drew the explorer); None before.
    seen_at: float | None = None

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.observe(self._seen, names="width")

    def _seen(self, change) -> None:
        if change["new"] and self.seen_at is None:
            self.seen_at = time.monotonic()

    #: Pixels kept free right of a figure (rounding, a border); the narrowest width a figure is given.
    MARGIN_PX, MIN_PX = 8, 320

    def figure_width(self, default: int) -> int:
        """Pixels for a figure: the reported width less :attr:`MARGIN_PX` (at least :attr:`MIN_PX`), or
        ``default`` before the browser has reported one (a figure drawn before it is attached otherwise
        takes plotly's 700 px)."""
        return max(self.width - self.MARGIN_PX, self.MIN_PX) if self.width else default


def wrapping_row(children: Sequence[widgets.Widget], **layout) -> widgets.HBox:
    """A row of controls that wraps onto the next line when the notebook is narrow, rather than
    squeezing sliders down to their handles."""
    return widgets.HBox(list(children), layout=widgets.Layout(flex_flow="row wrap", **layout))


def slider_layout() -> widgets.Layout:
    """A slider's width: a share of its row between 280 and 480 px, never a fixed width wider than the notebook."""
    return widgets.Layout(flex="1 1 360px", min_width="280px", max_width="480px", width="auto")


@contextlib.contextmanager
def busy(box: widgets.Box, status: widgets.HTML) -> Iterator[None]:
    """Mark ``box`` busy (:data:`BUSY_CLASS`; its status line reads :data:`BUSY_TEXT`) while the body
    recomputes and redraws: the reader sees at once that a change was taken (issue 29 item 4). The body
    sets the status line's final text; the class is removed whatever happens."""
    box.add_class(BUSY_CLASS)
    status.value = BUSY_TEXT
    try:
        yield
    finally:
        box.remove_class(BUSY_CLASS)


def watch_drawn(fw: go.FigureWidget) -> go.FigureWidget:
    """Note on ``fw`` when a browser has drawn what the kernel last sent it: plotly's widget code sends the drawn
    traces back after its first draw and after each edit (``_js2py_traceDeltas``, with the trace edit it drew; its
    layout goes to ``_js2py_widget_layoutDelta``, a name plotly 7.1's Python side does not read). A widget anywidget
    gave up starting (issue 29 item 1) never does, or does late, drawn from the state it was created with: the edits
    sent meanwhile are lost, so it reports an older edit, or (a new widget made with its content, edit 0) other
    traces than the kernel's; either way the figure stays undrawn (:func:`undrawn`)."""
    def drew(change) -> None:
        report = change["new"]
        if report and report.get("trace_edit_id") == fw._last_trace_edit_id and \
                [d.get("uid") for d in report.get("trace_deltas", ())] == [t.uid for t in fw.data]:
            fw._workbench_drawn = True

    fw.observe(drew, names="_js2py_traceDeltas")
    return fw


#: How many times an explorer gives a figure the page did not draw a new widget before it names it undrawn.
MAX_REDRAWS = 2


def undrawn(figures: Mapping[str, go.FigureWidget]) -> list[str]:
    """The names of the figures plotly's widget code has not reported drawing (:func:`watch_drawn`)."""
    return [name for name, fw in figures.items() if not getattr(fw, "_workbench_drawn", False)]


def redraw_undrawn(probe: WidthProbe, figures: dict[str, go.FigureWidget],
                   rows: Mapping[str, widgets.Box]) -> list[str]:
    """Give each figure a live page has not drawn a new ``FigureWidget`` with the same content, in its place in
    ``rows[name]`` and in ``figures`` (up to :data:`MAX_REDRAWS` times; call it when the page asks, ``checks``).
    anywidget gives a widget 2 s to start: on a busy page (load 6-8) the first figures wait longer for plotly's
    5 MB widget code (:mod:`~workbench.views.figure_widget`), are drawn late without the kernel's updates and stay
    blank, while a new widget, made once the code is there, starts at once (as re-running the cell did). Returns
    the names given new widgets."""
    missing = undrawn(figures)
    if not missing or probe.seen_at is None or probe.redraws >= MAX_REDRAWS:
        return []
    for name in missing:
        old = figures[name]
        figures[name] = new = watch_drawn(FigureWidget(old.to_dict()))
        rows[name].children = tuple(new if child is old else child for child in rows[name].children)
        old.close()
    probe.redrawn_at = time.monotonic()
    probe.redraws += 1  # the page asks again after the grace
    return missing


def undrawn_notice(probe: WidthProbe, figures: Mapping[str, go.FigureWidget], now: float | None = None) -> str:
    """HTML that says which figures a live page has not drawn :data:`DRAW_GRACE_S` after it drew the explorer, or
    after the last of :data:`MAX_REDRAWS` redraws (:func:`redraw_undrawn`), why, and the remedy; empty when all
    are drawn, while a redraw is still due, or with no page (a kernel without a browser, a test)."""
    since = probe.redrawn_at if probe.redrawn_at is not None else probe.seen_at
    if since is None or (time.monotonic() if now is None else now) - since < DRAW_GRACE_S or \
            probe.redraws < MAX_REDRAWS:
        return ""
    missing = undrawn(figures)
    if not missing:
        return ""
    return ("<br><span style='color:#B00020'><b>Not drawn:</b> " + html.escape(", ".join(missing)) +
            ". The browser did not start plotly's widget within the 2 s anywidget allows (its code, about 5 MB, "
            f"loads once a page), {probe.redraws + 1} times ('[anywidget] Failed to initialize model' in its "
            "console; a busy machine). Re-run this cell to draw them; reloading the page does not.</span>")

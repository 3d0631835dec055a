"""A notebook made ready for an offline reveal.js deck: figures redrawn from their plotly data, widgets kept
only where the vendored renderer can draw them, slides marked, and a check that a page loads nothing remote."""

from __future__ import annotations

import json
import re
from typing import Mapping

from workbench.core.formats import PLOTLY_MIME

WIDGET_VIEW_MIME = "application/vnd.jupyter.widget-view+json"


WIDGET_STATE_MIME = "application/vnd.jupyter.widget-state+json"


#: Model modules the vendored html-manager renders without fetching anything.
BUILTIN_WIDGET_MODULES = ("@jupyter-widgets/base", "@jupyter-widgets/controls", "@jupyter-widgets/output")


#: What makes a browser fetch: a src/href of a loading tag, or a CSS @import, to another host.
_LOADS_REMOTE = re.compile(r"""<(?:script|link|img|iframe|source|video|audio|embed)\b[^>]*?\b(?:src|href)\s*=\s*["']?"""
                           r"""(?:https?:)?//[^"'\s>]+|@import\s+(?:url\()?\s*["']?(?:https?:)?//[^"')\s]+""", re.I)

#: What a deck shows where a live widget could not be kept.
LIVE_WIDGET_NOTE = "<p><em>(A live widget: open the notebook in JupyterLab to use it.)</em></p>"


def plotly_js() -> str:
    """The plotly.js bundle of the installed plotly, inlined once per deck."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def _figure_html(fig_dict: Mapping, div_id: str) -> str:
    import plotly.io as pio

    config = {**fig_dict.get("config", {}), "responsive": True, "displaylogo": False}
    return pio.to_html({k: v for k, v in fig_dict.items() if k != "config"}, config=config, include_plotlyjs=False,
                       include_mathjax=False, full_html=False, default_width="100%", validate=False, div_id=div_id)


#: A deck's figure text, in px of its 1280 px slide: a notebook's 12 px tick labels showed at about 8 px in a
#: 1024 px window, beside 42 px headings (issue 29, item 11).
DECK_FONT_PX = 14
#: The smallest text a deck's figure keeps, in px of its slide: 10 px in a 1024 px window (the slide drawn at
#: 0.78). A notebook's 11 px labels and a title's ``<sup>`` line (70% of the title) fell to 8.5-8.9 px there.
DECK_MIN_FONT_PX = 13


def _subtitle(title: dict) -> dict:
    """A title whose ``<sup>`` line (plotly draws it at 70% of the title) is set at :data:`DECK_MIN_FONT_PX`."""
    text = title.get("text")
    if not isinstance(text, str) or "<sup>" not in text:
        return title
    return {**title, "text": re.sub(r"<sup>(.*?)</sup>", rf"<span style='font-size:{DECK_MIN_FONT_PX}px'>\1</span>", text)}


def deck_fonts(fig: dict, base_px: int = DECK_FONT_PX) -> dict:
    """The figure with its text scaled for a slide: the base font at ``base_px`` and every explicit font size (the
    title's, annotations', the legend's, axes' ticks and titles', traces' text) by the same factor over plotly's
    12 px default, none under :data:`DECK_MIN_FONT_PX`, nor the title's ``<sup>`` line."""
    factor = base_px / 12
    layout = dict(fig.get("layout", {}))

    def scale(font):
        size = font.get("size")  # a number, or one per point (left as it is)
        return {**font, "size": max(DECK_MIN_FONT_PX, round(size * factor, 1))} if isinstance(size, (int, float)) else font

    layout["font"] = {**layout.get("font", {}), "size": max(base_px, layout.get("font", {}).get("size") or 0)}
    if isinstance(layout.get("title"), dict):
        layout["title"] = _subtitle({**layout["title"], **({"font": scale(layout["title"]["font"])}
                                                           if "font" in layout["title"] else {})})
    elif isinstance(layout.get("title"), str):
        layout["title"] = _subtitle({"text": layout["title"]})
    for name, axis in list(layout.items()):
        if re.fullmatch(r"[xy]axis\d*", name) and isinstance(axis, dict):
            axis = {**axis, **({"tickfont": scale(axis["tickfont"])} if "tickfont" in axis else {})}
            if isinstance(axis.get("title"), dict) and "font" in axis["title"]:
                axis["title"] = {**axis["title"], "font": scale(axis["title"]["font"])}
            layout[name] = axis
    data = [{**t, "textfont": scale(t["textfont"])} if isinstance(t.get("textfont"), dict) else t
            for t in fig.get("data", [])]
    legend = dict(layout.get("legend", {}))
    if "font" in legend:
        legend["font"] = scale(legend["font"])
    below = (legend.get("y") or 0) < 0 and legend.get("yref", "paper") == "paper"
    if below:  # under the axis title, which grew: at the figure's bottom edge, in a margin that holds both
        legend.update(yref="container", y=0, yanchor="bottom")
    if legend:
        layout["legend"] = legend
    if layout.get("annotations"):
        layout["annotations"] = [{**a, "font": scale(a["font"])} if "font" in a else a for a in layout["annotations"]]
    # the title's lines above and the axis title and legend below grow with the text: so do their margins
    margin = layout.get("margin", {})
    layout["margin"] = {**margin, **{side: round((margin.get(side) or default) * factor)
                                     for side, default in (("t", 100), ("b", 80))}}
    if below:
        layout["margin"]["b"] = max(layout["margin"]["b"], 120)
    title = layout.get("title", {}).get("text") if isinstance(layout.get("title"), dict) else None
    if isinstance(title, str):  # each <sup> line set at DECK_MIN_FONT_PX, taller than plotly's 70%: room above
        layout["margin"]["t"] += 8 * title.count(f"font-size:{DECK_MIN_FONT_PX}px")
    return {**fig, "data": data, "layout": layout}


def figures_to_html(nb) -> list[tuple[int, dict]]:
    """Give every plotly output (its JSON mimetype) an HTML div that only calls ``Plotly.newPlot``
    (the deck's head has plotly.js), in place of any HTML it had, its text sized for a slide
    (:func:`deck_fonts`); returns ``[(cell index, figure dict)]``."""
    figures = []
    for ci, cell in enumerate(nb.cells):
        for oi, out in enumerate(cell.get("outputs", [])):
            fig = out.get("data", {}).get(PLOTLY_MIME)
            if fig is None:
                continue
            fig = deck_fonts(dict(fig))
            out["data"] = {PLOTLY_MIME: fig, "text/html": _figure_html(fig, f"figure-{ci}-{oi}")}
            figures.append((ci, fig))
    return figures


def _referenced_models(state: Mapping, model_id: str, seen: set[str]) -> None:
    """Add ``model_id`` and every model its state names (``IPY_MODEL_<id>``), recursively, to ``seen``."""
    if model_id in seen:
        return
    seen.add(model_id)
    for ref in re.findall(r"IPY_MODEL_([0-9a-f]+)", json.dumps(state.get(model_id, {}).get("state", {}))):
        _referenced_models(state, ref, seen)


def keep_renderable_widgets(nb) -> int:
    """Keep a widget view only if every model it reaches is one the vendored renderer bundles.

    Drops the other views (their state would make the renderer fetch JavaScript from a CDN) and
    every model no kept view reaches. Returns the number of views kept.
    """
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE_MIME, {}).get("state", {})
    kept: set[str] = set()
    num_kept = 0
    for cell in nb.cells:
        outputs = []
        for out in cell.get("outputs", []):
            view = out.get("data", {}).get(WIDGET_VIEW_MIME)
            if view is not None:
                reached: set[str] = set()
                _referenced_models(state, view["model_id"], reached)
                if not all(m in state and state[m]["model_module"] in BUILTIN_WIDGET_MODULES for m in reached):
                    out = {**out, "data": {"text/html": LIVE_WIDGET_NOTE}}
                else:
                    kept |= reached
                    num_kept += 1
            outputs.append(out)
        if "outputs" in cell:
            cell.outputs = outputs
    if state:
        if kept:
            nb.metadata.widgets[WIDGET_STATE_MIME]["state"] = {k: v for k, v in state.items() if k in kept}
        else:
            nb.metadata.pop("widgets")
    return num_kept


def auto_slides(nb) -> bool:
    """A notebook without slide metadata: a new slide at every markdown cell that opens with a
    ``#`` or ``##`` heading. Returns whether it changed anything."""
    if any("slide_type" in c.metadata.get("slideshow", {}) for c in nb.cells):
        return False
    for cell in nb.cells:
        if cell.cell_type == "markdown" and re.match(r"\s*##?\s", cell.source):
            cell.metadata["slideshow"] = {"slide_type": "slide"}
    return True


def remote_loads(page: str) -> list[str]:
    """The tags and CSS imports in an HTML page that would fetch from another host (inline scripts'
    text, such as plotly.js's URL strings, is not looked at; links a reader clicks are fine)."""
    markup = re.sub(r"(<script\b[^>]*>).*?(</script>)", r"\1\2", page, flags=re.S | re.I)
    return [m.group(0)[:160] for m in _LOADS_REMOTE.finditer(markup)]

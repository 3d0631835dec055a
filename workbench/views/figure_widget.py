"""A plotly ``FigureWidget`` whose widget code a page loads once, not once per figure.

plotly's ``FigureWidget`` is an anywidget, and each one carries plotly's whole widget code (``widgetbundle.js``, about
5 MB) in its ``_esm``: the kernel sends it with every figure, and the page imports it again, from a new blob URL, for
each. anywidget gives a widget 2 s to start (its model's ``initialize``); on a busy machine figures importing 5 MB each
at once missed it. Such a figure is drawn late, from the state it was created with: every update the kernel sent in the
meantime is lost, so an explorer's figure stayed blank (issue 29 item 1; a CI run's explorers, 120 s after the kernel
went idle). :class:`FigureWidget` sends the code once per kernel, in one :class:`PlotlyCode` widget that has no view,
and its own ``_esm`` is a small module that imports that code once per page and starts plotly's widget with it: the
first figure waits for the one import, and every later figure, a redrawn one too, starts at once.
"""

from __future__ import annotations

import ipywidgets as widgets
import plotly
import plotly.graph_objects as go
import traitlets

#: The page's one import of plotly's widget code, per plotly version (two kernels on one page may differ).
_PAGE_KEY = f"__workbenchPlotlyWidget_{plotly.__version__}"
#: Seconds after which a page forgets an import of that code still pending (a hung import), so that a redrawn figure
#: (:func:`~workbench.views.widget_sync.redraw_undrawn`, 20 s after the page drew the explorer) imports it anew.
FORGET_S = 15

_ESM = """
const KEY = PAGE_KEY;
// plotly's widget module: imported once per page from the code the kernel sent once (PlotlyCode). A failed import,
// or one still pending after FORGET_MS, is forgotten, so the next figure (a redrawn one) tries again.
function plotlyModule(model) {
  let loading = globalThis[KEY];
  if (!loading) {
    loading = globalThis[KEY] = (async () => {
      const ref = model.get("_plotly_code");
      const holder = await model.widget_manager.get_model(ref.slice("IPY_MODEL_".length));
      const url = URL.createObjectURL(new Blob([holder.get("code")], { type: "text/javascript" }));
      let module;
      try { module = await import(url); } finally { URL.revokeObjectURL(url); }
      if (typeof module.default !== "function") throw new Error("[workbench] plotly's widget code has no default export");
      return module;
    })();
    const forget = () => { if (globalThis[KEY] === loading) delete globalThis[KEY]; };
    const timer = setTimeout(forget, FORGET_MS);
    loading.then(() => clearTimeout(timer), forget);
  }
  return loading;
}
// plotly's own widget for this figure, started once its module is there (anywidget holds the kernel's messages until
// initialize returns, so none is missed).
export default () => {
  let figure = null;
  return {
    async initialize(context) {
      figure = (await plotlyModule(context.model)).default();
      return figure.initialize(context);
    },
    render(context) { return figure.render(context); },
  };
};
""".replace("PAGE_KEY", repr(_PAGE_KEY)).replace("FORGET_MS", str(FORGET_S * 1000))


class PlotlyCode(widgets.Widget):
    """plotly's widget code (``widgetbundle.js``), sent to the page once per kernel for every :class:`FigureWidget`
    (:func:`plotly_code`); a model with no view."""

    code = traitlets.Unicode().tag(sync=True)


_code: PlotlyCode | None = None


def plotly_code() -> PlotlyCode:
    """The kernel's one :class:`PlotlyCode`, made on first use, and again after it was closed (``Widget.close_all``)."""
    global _code
    if _code is None or _code.comm is None:
        _code = PlotlyCode(code=str(go.FigureWidget._esm))
    return _code


class FigureWidget(go.FigureWidget):
    """plotly's ``FigureWidget``, the same in the kernel, that loads its widget code once per page (module docs)."""

    _esm = _ESM
    _plotly_code = traitlets.Instance(PlotlyCode).tag(sync=True, **widgets.widget_serialization)

    @traitlets.default("_plotly_code")
    def _default_plotly_code(self) -> PlotlyCode:
        return plotly_code()

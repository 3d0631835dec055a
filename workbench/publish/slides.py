"""Reveal.js decks that work offline (the deck's own content is :mod:`workbench.studies.design_review`).

:func:`export_slides` turns any notebook into a reveal.js deck that loads nothing from the network
at view time, where ``jupyter nbconvert --to slides`` loads reveal.js, require.js, jquery, MathJax
and the widget renderer from CDNs (so offline the deck never starts):

* the JavaScript is copied from ``vendor/slides/`` (committed, pinned npm packages, see its
  ``update.py``) into ``<out>/assets/``, and the deck refers to it by relative paths;
* plotly.js is inlined once, in the head (before require.js, where older plotly.js bundles would
  register as an anonymous AMD module instead of setting ``window.Plotly``; a ``define('plotly')``
  shim serves outputs of plotly's require-based ``notebook`` renderer); every figure output is
  redrawn from its ``application/vnd.plotly.v1+json`` data (plotly's default renderer in a kernel,
  which nbconvert does not render at all) as a div that only calls ``Plotly.newPlot``. So no
  figure depends on another cell's output: a skipped slide cannot take plotly.js away;
* the theme (``workbench``, in the vendored reveal.js folder) uses system fonts only;
* live widgets keep their saved state only when every model they reference is one the vendored
  ``@jupyter-widgets/html-manager`` bundles; others (plotly's ``FigureWidget`` is an anywidget,
  whose JavaScript the renderer would fetch from a CDN) are dropped from the deck.

``static=True`` also writes each figure as PNG and SVG (kaleido, which drives Chromium) and the
deck as PDF (reveal.js's ``?print-pdf`` layout printed by Chromium through playwright).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from workbench.core import paths
from workbench.publish.reveal import (
    auto_slides,
    figures_to_html,
    keep_renderable_widgets,
    plotly_js,
    remote_loads,
)
from workbench.publish.static import SLIDE_HEIGHT, SLIDE_WIDTH, export_pdf, write_figures
from workbench.runs.atomic import write_atomic

VENDOR_DIR = paths.VENDOR_DIR / "slides"
DECK_NOTEBOOK = paths.NOTEBOOK_DIR / "00_design_review.ipynb"
#: The deck's folder of copied JavaScript and CSS, beside its HTML.
ASSETS = "assets"
#: Vendored files every deck needs, and those a deck with live widgets needs too.
_CORE_ASSETS = ("reveal.js/dist/reveal.js", "reveal.js/dist/reveal.css", "reveal.js/plugin/notes/notes.js",
                "requirejs/require.js", "jquery/dist/jquery.min.js", "mathjax/es5/tex-svg-full.js")
_WIDGET_ASSETS = ("@jupyter-widgets/html-manager/dist/embed-amd.js",
                  "@jupyter-widgets/html-manager/dist/1551f4f60c37af51121f.woff2",
                  "@jupyter-widgets/html-manager/dist/7a3337626410ca2f4071.woff2",
                  "@jupyter-widgets/html-manager/dist/d878b0a6a1144760244f.woff2")

# --------------------------------------------------------------------------- the deck's content


# --------------------------------------------------------------------------- export


@dataclass(frozen=True)
class SlidesResult:
    """One exported deck: its HTML, the seconds the export took, and its size with its assets."""

    notebook: Path
    html: Path
    seconds: float
    deck_bytes: int
    num_figures: int
    static: tuple[Path, ...] = ()


def vendor_manifest() -> dict[str, dict]:
    """``vendor/slides/MANIFEST.json``: every vendored file's package, source path and SHA-256."""
    return json.loads((VENDOR_DIR / "MANIFEST.json").read_text())


_TEMPLATE = r"""{%- extends 'index.html.j2' -%}
{%- block html_head_js -%}
<script>window.PlotlyConfig = {MathJaxConfig: 'local'};</script>
<script>{{ resources.workbench.plotly_js }}</script>
<script src="{{ resources.jquery_url }}"></script>
<script src="{{ resources.require_js_url }}"></script>
<script>define('plotly', [], function () { return window.Plotly; });</script>
{%- endblock html_head_js -%}
{%- block html_head_css -%}
<style>
/* reveal.js breaks the page after every slide, the last too: a blank last page in the PDF. */
html.print-pdf .reveal .slides .pdf-page:last-of-type { page-break-after: avoid; break-after: avoid; }
</style>
{%- endblock html_head_css -%}
{%- block html_head_js_mathjax -%}
<script>
(function () {
  // The widget renderer typesets through MathJax 2's API (MathJax.Hub.Queue): map it onto MathJax 3.
  var hub = {Queue: function () {
    for (var i = 0; i < arguments.length; i++) {
      var job = arguments[i];
      if (Array.isArray(job) && job[0] === 'Typeset' && window.MathJax.typesetPromise) {
        window.MathJax.typesetPromise(job[2] ? [job[2]] : undefined);
      }
    }
  }};
  window.MathJax = {
    tex: {inlineMath: [['$', '$'], ['\\(', '\\)']], displayMath: [['$$', '$$'], ['\\[', '\\]']], processEscapes: true},
    svg: {fontCache: 'global'},
    options: {ignoreHtmlClass: 'tex2jax_ignore|plotly-graph-div'},
    startup: {ready: function () { window.MathJax.startup.defaultReady(); window.MathJax.Hub = hub; }},
    Hub: hub
  };
})();
</script>
<script src="{{ resources.mathjax_url }}" id="MathJax-script"></script>
{%- endblock html_head_js_mathjax -%}
{% block footer_js %}
<script>
require({waitSeconds: 30}, ["{{ resources.reveal.url_prefix }}/dist/reveal.js",
                            "{{ resources.reveal.url_prefix }}/plugin/notes/notes.js"],
function (Reveal, RevealNotes) {
  function plots(scope) {
    return Array.prototype.slice.call(scope.querySelectorAll('.plotly-graph-div'));
  }
  // Figures drawn while their slide was hidden have the default size: redraw them to fit. A table also
  // placed its multi-line headers from line heights read as 0 there (the text ran out of its cells):
  // a new data revision makes Plotly.react draw it again, now visible.
  function fit(scope) {
    return Promise.all(plots(scope).map(function (gd) {
      var table = (gd.data || []).some(function (t) { return t.type === 'table'; });
      return window.Plotly.Plots.resize(gd).then(function () {
        return table ? window.Plotly.react(gd, gd.data, Object.assign({}, gd.layout, {datarevision: Date.now()})) : gd;
      });
    }));
  }
  // ready: the current slide's figures fit; pdfReady: every figure fits the print layout.
  var deck = window.workbenchDeck = {ready: false, pdfReady: false, fit: fit, errors: []};
  function settle(promise, flag) {
    deck[flag] = false;
    promise.then(function () { deck[flag] = true; },
                 function (err) { deck.errors.push(String(err)); deck[flag] = true; });
  }
  Reveal.on('ready', function (event) { settle(fit(event.currentSlide), 'ready'); });
  Reveal.on('slidechanged', function (event) { settle(fit(event.currentSlide), 'ready'); });
  Reveal.on('pdf-ready', function () { settle(fit(document), 'pdfReady'); });
  Reveal.initialize({
    controls: true, progress: true, history: true, hash: true,
    transition: "{{ resources.reveal.transition }}", slideNumber: "c/t", plugins: [RevealNotes],
    width: {{ resources.reveal.width }}, height: {{ resources.reveal.height }}, margin: 0.03,
    center: false, pdfSeparateFragments: false, pdfMaxPagesPerSlide: 1, viewDistance: 100,
    navigationMode: "linear"  // ArrowRight (and a clicker's "next") visits sub-slides too: no slide is missed
  });
  window.Reveal = Reveal;
});
</script>
{% endblock footer_js %}
"""


def _exporter(theme: str, hide_code: bool):
    import jinja2
    from nbconvert.exporters import SlidesExporter
    from traitlets.config import Config

    c = Config()
    c.TagRemovePreprocessor.enabled = True
    c.TagRemovePreprocessor.remove_cell_tags = {"remove_cell", "remove-cell"}
    c.TagRemovePreprocessor.remove_input_tags = {"remove_input", "remove-input", "hide-input", "hide_input"}
    c.TagRemovePreprocessor.remove_all_outputs_tags = {"remove_output", "remove-output"}
    exporter = SlidesExporter(config=c, extra_loaders=[jinja2.DictLoader({"workbench_reveal.html.j2": _TEMPLATE})])
    exporter.template_file = "workbench_reveal.html.j2"
    prefix = f"{ASSETS}/"
    exporter.reveal_url_prefix = prefix + "reveal.js"
    exporter.reveal_theme = theme
    exporter.reveal_transition = "none"
    exporter.reveal_scroll = True
    exporter.reveal_width, exporter.reveal_height = str(SLIDE_WIDTH), str(SLIDE_HEIGHT)
    exporter.require_js_url = prefix + "requirejs/require.js"
    exporter.jquery_url = prefix + "jquery/dist/jquery.min.js"
    exporter.mathjax_url = prefix + "mathjax/es5/tex-svg-full.js"
    exporter.widget_renderer_url = prefix + "@jupyter-widgets/html-manager/dist/embed-amd.js"
    exporter.jupyter_widgets_base_url = prefix
    exporter.font_awesome_url = ""
    exporter.mermaid_js_url = ""
    exporter.exclude_input = hide_code
    exporter.exclude_input_prompt = exporter.exclude_output_prompt = True
    return exporter


def _copy_assets(out_dir: Path, names: Iterable[str], theme: str) -> None:
    manifest = vendor_manifest()
    for name in [*names, f"reveal.js/dist/theme/{theme}.css", *(p for p in manifest if p.startswith("LICENSES/"))]:
        if name not in manifest:
            raise FileNotFoundError(f"{name} is not among the vendored files in {VENDOR_DIR} (see its MANIFEST.json).")
        dest = out_dir / ASSETS / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(dest, (VENDOR_DIR / name).read_bytes())


def _check_theme(theme: str) -> None:
    path = VENDOR_DIR / "reveal.js" / "dist" / "theme" / f"{theme}.css"
    if not re.fullmatch(r"[A-Za-z0-9_-]+", theme) or not path.is_file():
        known = sorted(p.stem for p in path.parent.glob("*.css"))
        raise ValueError(f"Unknown slide theme {theme!r}; vendored themes: {', '.join(known)}.")
    css = path.read_text()
    if re.search(r"@import|@font-face|url\(\s*['\"]?https?:", css):
        raise ValueError(f"Theme {theme!r} loads fonts or styles from elsewhere (@import/@font-face/url()); "
                         "a deck must load nothing at view time.")


def export_slides(notebook: Path | str, out_dir: Path | str, *, execute: bool = True, small: bool = False,
                  static: bool = False, theme: str = "workbench", hide_code: bool | None = None,
                  timeout_s: int = 600) -> SlidesResult:
    """Export ``notebook`` as an offline reveal.js deck ``<out_dir>/<stem>.slides.html`` (+ ``assets/``).

    Args:
        notebook: Any ``.ipynb``. Cells keep their slide metadata; a notebook with none gets a slide
            per ``#``/``##`` heading. Cells tagged ``hide-input`` (or ``remove_input``) show outputs only.
        out_dir: Folder for the deck, its ``assets/`` and, with ``static``, ``<stem>_figures/`` and the PDF.
        execute: Run the notebook first (fresh kernel, cwd = its folder); else use its stored outputs.
        small: Execute in the small configuration (``WORKBENCH_SMALL=1``).
        static: Also write each figure as PNG and SVG, and the deck as ``<stem>.slides.pdf``.
        theme: A reveal.js theme under ``vendor/slides/reveal.js/dist/theme`` that loads no fonts.
        hide_code: ``True`` hides every code input; default: the notebook's metadata
            ``workbench.hide_code`` (the deck sets it), else ``False``.
        timeout_s: Longest a cell may run.

    Raises:
        FileNotFoundError: no such notebook, or (``static``) no Chromium.
        ValueError: an unknown or font-loading theme, or an output that would load from the network.
    """
    import nbformat

    from workbench.publish.execute import execute_notebook

    t0 = time.perf_counter()
    notebook, out_dir = Path(notebook), Path(out_dir)
    if notebook.suffix != ".ipynb" or not notebook.is_file():
        raise FileNotFoundError(f"No notebook {notebook} (an existing .ipynb file is needed).")
    _check_theme(theme)
    if execute:
        nb = execute_notebook(notebook, timeout_s=timeout_s, WORKBENCH_EXPORT="0", WORKBENCH_SMALL="1" if small else "0")
    else:
        nb = nbformat.read(notebook, as_version=4)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    keeps_widgets = keep_renderable_widgets(nb) > 0
    auto_slides(nb)
    figures = figures_to_html(nb)
    if hide_code is None:
        hide_code = bool(nb.metadata.get("workbench", {}).get("hide_code", False))
    exporter = _exporter(theme, hide_code)
    body, _ = exporter.from_notebook_node(
        nb, resources={"metadata": {"name": notebook.stem}, "workbench": {"plotly_js": plotly_js()}})
    remote = remote_loads(body)
    if remote:
        raise ValueError(f"{notebook.name}: the deck would load from the network: {remote[:5]} "
                         "(an output made by a CDN-linked renderer? re-run it with plotly's default renderer)")
    out_dir.mkdir(parents=True, exist_ok=True)
    html_path = out_dir / f"{notebook.stem}.slides.html"
    write_atomic(html_path, body)
    _copy_assets(out_dir, _CORE_ASSETS + (_WIDGET_ASSETS if keeps_widgets else ()), theme)
    deck_bytes = html_path.stat().st_size + sum(p.stat().st_size for p in (out_dir / ASSETS).rglob("*") if p.is_file())
    written: tuple[Path, ...] = ()
    if static:
        written = tuple(write_figures(figures, out_dir / f"{notebook.stem}_figures")) + (export_pdf(html_path),)
    return SlidesResult(notebook, html_path, time.perf_counter() - t0, deck_bytes, len(figures), written)



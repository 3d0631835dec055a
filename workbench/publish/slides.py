"""Design-review slides: the deck's own figures, and reveal.js decks that work offline.

The deck (``notebooks/00_design_review.ipynb``) is thin: it calls the package's figure
functions and, for what no other module draws, the ``fig_*`` and table functions here. It reads
a committed reference run store (:func:`reference_runs_dir`), never trains.

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

import hashlib
import html
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

import pandas as pd
import plotly.graph_objects as go

from workbench.core import paths
from workbench.runs.spec import VALIDATION_MODEL
from workbench.views.style import TEMPLATE

VENDOR_DIR = paths.VENDOR_DIR / "slides"
DECK_NOTEBOOK = paths.NOTEBOOK_DIR / "00_design_review.ipynb"
PLOTLY_MIME = "application/vnd.plotly.v1+json"
WIDGET_VIEW_MIME = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE_MIME = "application/vnd.jupyter.widget-state+json"
#: Model modules the vendored html-manager renders without fetching anything.
BUILTIN_WIDGET_MODULES = ("@jupyter-widgets/base", "@jupyter-widgets/controls", "@jupyter-widgets/output")
#: Chromium executables tried in order (``WORKBENCH_CHROMIUM`` first); Debian's is ``chromium``.
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_ARGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync")
#: Logical slide size in CSS pixels (reveal.js scales it to the window).
SLIDE_WIDTH, SLIDE_HEIGHT = 1280, 720
ASSETS = "assets"
#: Shown in a deck where a live widget (one the offline renderer cannot draw) was.
LIVE_WIDGET_NOTE = "<p><em>(A live widget: open the notebook in JupyterLab to use it.)</em></p>"
_CORE_ASSETS = ("reveal.js/dist/reveal.js", "reveal.js/dist/reveal.css", "reveal.js/plugin/notes/notes.js",
                "requirejs/require.js", "jquery/dist/jquery.min.js", "mathjax/es5/tex-svg-full.js")
_WIDGET_ASSETS = ("@jupyter-widgets/html-manager/dist/embed-amd.js",
                  "@jupyter-widgets/html-manager/dist/1551f4f60c37af51121f.woff2",
                  "@jupyter-widgets/html-manager/dist/7a3337626410ca2f4071.woff2",
                  "@jupyter-widgets/html-manager/dist/d878b0a6a1144760244f.woff2")
#: What makes a browser fetch: a src/href of a loading tag, or a CSS @import, to another host.
_LOADS_REMOTE = re.compile(r"""<(?:script|link|img|iframe|source|video|audio|embed)\b[^>]*?\b(?:src|href)\s*=\s*["']?"""
                           r"""(?:https?:)?//[^"'\s>]+|@import\s+(?:url\()?\s*["']?(?:https?:)?//[^"')\s]+""", re.I)

# --------------------------------------------------------------------------- the deck's content

#: MLX PR #3130 "FSDP (easy)", step time in ms on 8 GPUs: (params, communication_size in MiB,
#: DDP, FSDP, DDP bf16, FSDP bf16). Source: the PR's benchmark table (seed 003 in shared/).
PR3130_STEP_TIMES_MS = (
    ("0.3B", 16, 6.96, 6.94, 5.54, 5.38),
    ("2.7B", 32, 33.54, 34.79, 24.65, 27.89),
    ("5.4B", 16, 63.07, 65.23, 45.59, 47.44),
)
#: The committed run stores the deck reads (``scripts/make_reference_runs.py`` makes them), by name:
#: ``(framework, strategy)`` pairs and the spec fields they share.
#:
#: * ``convergence``: a 0.4M-parameter LM on a 64-token Markov chain, near its entropy floor in 100
#:   steps; every strategy in MLX and JAX (ZeRO-3 in JAX only).
#: * ``memory``: notebook 03's validation runs (a 3.4M-parameter LM, 3 steps), large enough for the
#:   memory model's peak to be compared with MLX's measured one.
REFERENCE_STORES = {
    "convergence": (
        (("mlx", "ddp"), ("mlx", "fsdp-row"), ("mlx", "fsdp-flat"),
         ("jax", "ddp"), ("jax", "fsdp-row"), ("jax", "fsdp-flat"), ("jax", "fsdp-full")),
        dict(num_ranks=2, steps=100, global_batch=16,
             model=dict(vocab_size=64, seq_len=32, dim=128, num_layers=2, num_heads=4, mlp_dim=512),
             optimizer="adamw", learning_rate=3e-3, communication_size=256 * 1024, data_seed=0, concentration=0.1),
    ),
    "memory": (
        (("mlx", "ddp"), ("mlx", "fsdp-row"), ("mlx", "fsdp-flat"), ("jax", "ddp"), ("jax", "fsdp-full")),
        dict(num_ranks=2, steps=3, global_batch=8, communication_size=2**20,
             model=VALIDATION_MODEL),
    ),
}


def reference_runs_dir(name: str = "convergence") -> Path:
    """A committed run store the deck reads: ``notebooks/reference_runs/<name>`` (see :data:`REFERENCE_STORES`).

    Raises:
        ValueError: on an unknown store name.
    """
    if name not in REFERENCE_STORES:
        raise ValueError(f"Unknown reference run store {name!r}; known: {', '.join(REFERENCE_STORES)}.")
    return paths.NOTEBOOK_DIR / "reference_runs" / name


def step_time_table() -> pd.DataFrame:
    """PR #3130's DDP and FSDP step times, with FSDP's overhead over DDP in percent."""
    df = pd.DataFrame(PR3130_STEP_TIMES_MS, columns=["params", "communication_size_MiB", "ddp_ms", "fsdp_ms",
                                                     "ddp_bf16_ms", "fsdp_bf16_ms"])
    df["fsdp_overhead_pct"] = (100 * (df.fsdp_ms / df.ddp_ms - 1)).round(1)
    df["fsdp_bf16_overhead_pct"] = (100 * (df.fsdp_bf16_ms / df.ddp_bf16_ms - 1)).round(1)
    return df.set_index("params")


def fig_step_time_table(table: pd.DataFrame | None = None, *, height: int = 420) -> go.Figure:
    """FSDP's step time against DDP's (PR #3130): grouped bars in ms, overhead in percent on top."""
    t = step_time_table() if table is None else table
    fig = go.Figure(layout=dict(template=TEMPLATE, height=height, barmode="group", yaxis_title="ms per step",
                                title="Step time, DDP vs FSDP on 8 GPUs (MLX PR #3130)",
                                legend=dict(orientation="h", y=-0.15)))
    x = [f"{p}, {c} MiB buckets" for p, c in zip(t.index, t.communication_size_MiB)]
    for col, name, color in (("ddp_ms", "DDP fp32", "#4C78A8"), ("fsdp_ms", "FSDP fp32", "#F58518"),
                             ("ddp_bf16_ms", "DDP bf16", "#9ECAE9"), ("fsdp_bf16_ms", "FSDP bf16", "#FFBF79")):
        over = {"fsdp_ms": t.fsdp_overhead_pct, "fsdp_bf16_ms": t.fsdp_bf16_overhead_pct}.get(col)
        fig.add_trace(go.Bar(x=x, y=t[col].tolist(), name=name, marker_color=color,
                             text=None if over is None else [f"{v:+.1f}%" for v in over], textposition="outside"))
    return fig


def key_numbers(gap, validation: pd.DataFrame) -> pd.Series:
    """The numbers the recommendation cites, each computed here.

    Args:
        gap: :func:`workbench.estimate.cases.explain_qwen_3_7b` (MLX PR #3130's measured peaks).
        validation: :func:`workbench.studies.memory.memory_validation` of the reference runs.

    Raises:
        ValueError: if ``validation`` lacks the MLX DDP and FSDP runs it compares.
    """
    t = step_time_table()
    mlx = validation[validation.framework == "mlx"]
    state = mlx[mlx.component == "optimizer_state"].groupby("strategy").measured_bytes.max()
    if "ddp" not in state or not any(s.startswith("fsdp") for s in state.index):
        raise ValueError("key_numbers: validation needs MLX ddp and fsdp runs with measured optimizer state.")
    fsdp_state = max(v for k, v in state.items() if k.startswith("fsdp"))
    error = (mlx.ratio - 1).abs()
    return pd.Series({
        "Qwen 3.7B, 8 GPUs: DDP - FSDP peak, measured (GB)": round(gap.measured_difference_bytes / 1e9, 1),
        "Qwen 3.7B, 8 GPUs: DDP - FSDP, modelled (GB)": round(gap.predicted_difference_bytes / 1e9, 1),
        "PR #3130: FSDP step-time overhead over DDP, fp32, worst (%)": float(t.fsdp_overhead_pct.max()),
        "PR #3130: FSDP step-time overhead over DDP, bf16, worst (%)": float(t.fsdp_bf16_overhead_pct.max()),
        "reference runs, 2 ranks: FSDP optimizer state / DDP's, measured": round(fsdp_state / state["ddp"], 3),
        "reference runs, MLX: worst |measured / modelled - 1|, peak (%)": round(
            100 * float(error[mlx.component == "peak"].max()), 1),
        "reference runs, MLX: worst |measured / modelled - 1|, parameters and state (%)": round(
            100 * float(error[mlx.component != "peak"].max()), 1),
    })


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


def find_chromium() -> str:
    """The Chromium to drive: ``$WORKBENCH_CHROMIUM``, else the first of :data:`CHROMIUM_NAMES` on PATH.

    Raises:
        FileNotFoundError: naming what was tried and how to install Debian's ``chromium``.
    """
    given = os.environ.get("WORKBENCH_CHROMIUM")
    if given:
        if not (Path(given).is_file() and os.access(given, os.X_OK)):
            raise FileNotFoundError(f"WORKBENCH_CHROMIUM={given!r} is not an executable file.")
        return given
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    raise FileNotFoundError(f"No Chromium found (tried {', '.join(CHROMIUM_NAMES)} on PATH): install Debian's "
                            "`apt-get install chromium`, or set WORKBENCH_CHROMIUM to a Chrome/Chromium executable.")


def launch_chromium(playwright, **kwargs):
    """A headless Chromium through playwright with the flags that keep it off the network."""
    return playwright.chromium.launch(executable_path=find_chromium(), args=list(CHROMIUM_ARGS), headless=True, **kwargs)


def _plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def _figure_html(fig_dict: Mapping, div_id: str) -> str:
    import plotly.io as pio

    config = {**fig_dict.get("config", {}), "responsive": True, "displaylogo": False}
    return pio.to_html({k: v for k, v in fig_dict.items() if k != "config"}, config=config, include_plotlyjs=False,
                       include_mathjax=False, full_html=False, default_width="100%", validate=False, div_id=div_id)


def figures_to_html(nb) -> list[tuple[int, dict]]:
    """Give every plotly output (its JSON mimetype) an HTML div that only calls ``Plotly.newPlot``
    (the deck's head has plotly.js), in place of any HTML it had; returns ``[(cell index, figure dict)]``."""
    figures = []
    for ci, cell in enumerate(nb.cells):
        for oi, out in enumerate(cell.get("outputs", [])):
            fig = out.get("data", {}).get(PLOTLY_MIME)
            if fig is None:
                continue
            fig = dict(fig)
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
  // Figures drawn while their slide was hidden have the default size: redraw them to fit.
  function fit(scope) {
    return Promise.all(plots(scope).map(function (gd) { return window.Plotly.Plots.resize(gd); }));
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
    center: false, pdfSeparateFragments: false, pdfMaxPagesPerSlide: 1, viewDistance: 100
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
        shutil.copyfile(VENDOR_DIR / name, dest)


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

    from workbench.publish.nbtools import execute_notebook

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
        nb, resources={"metadata": {"name": notebook.stem}, "workbench": {"plotly_js": _plotly_js()}})
    remote = remote_loads(body)
    if remote:
        raise ValueError(f"{notebook.name}: the deck would load from the network: {remote[:5]} "
                         "(an output made by a CDN-linked renderer? re-run it with plotly's default renderer)")
    out_dir.mkdir(parents=True, exist_ok=True)
    html_path = out_dir / f"{notebook.stem}.slides.html"
    html_path.write_text(body, encoding="utf-8")
    _copy_assets(out_dir, _CORE_ASSETS + (_WIDGET_ASSETS if keeps_widgets else ()), theme)
    deck_bytes = html_path.stat().st_size + sum(p.stat().st_size for p in (out_dir / ASSETS).rglob("*") if p.is_file())
    written: tuple[Path, ...] = ()
    if static:
        written = tuple(write_figures(figures, out_dir / f"{notebook.stem}_figures")) + (export_pdf(html_path),)
    return SlidesResult(notebook, html_path, time.perf_counter() - t0, deck_bytes, len(figures), written)


def remote_loads(page: str) -> list[str]:
    """The tags and CSS imports in an HTML page that would fetch from another host (inline scripts'
    text, such as plotly.js's URL strings, is not looked at; links a reader clicks are fine)."""
    markup = re.sub(r"(<script\b[^>]*>).*?(</script>)", r"\1\2", page, flags=re.S | re.I)
    return [m.group(0)[:160] for m in _LOADS_REMOTE.finditer(markup)]


def _slug(fig: Mapping) -> str:
    title = fig.get("layout", {}).get("title", {})
    text = title.get("text", "") if isinstance(title, Mapping) else str(title or "")
    text = re.sub(r"<[^>]+>.*", "", text)  # the title line only, no <br><sup> subtitle
    return re.sub(r"[^a-z0-9]+", "-", html.unescape(text).lower()).strip("-")[:48] or "figure"


def write_figures(figures: list[tuple[int, dict]], folder: Path, formats: tuple[str, ...] = ("png", "svg"),
                  *, width: int = 1200, height: int | None = None, scale: float = 2) -> list[Path]:
    """Write each ``(cell index, figure dict)`` as ``NN-<title>.<format>`` with kaleido (one Chromium for all)."""
    import plotly.io as pio

    if not figures:
        return []
    from workbench.publish.nbtools import scoped_env

    chromium = find_chromium()  # fails here with the clear message, not deep inside kaleido
    folder.mkdir(parents=True, exist_ok=True)
    figs, paths = [], []
    for k, (_, fig) in enumerate(figures):
        stem = f"{k + 1:02d}-{_slug(fig)}"
        for fmt in formats:
            figs.append(fig)
            paths.append(folder / f"{stem}.{fmt}")
    with scoped_env(BROWSER_PATH=chromium):  # kaleido's browser finder (choreographer) reads it
        pio.write_images(figs, paths, width=width, height=height, scale=scale, validate=False)
    missing = [str(p) for p in paths if not p.is_file() or p.stat().st_size == 0]
    if missing:
        raise RuntimeError(f"kaleido wrote no image for: {missing}")
    return paths


def export_pdf(deck_html: Path, pdf: Path | None = None, *, timeout_s: float = 120) -> Path:
    """Print a deck made by :func:`export_slides` to PDF (reveal.js's print layout, one page per slide)."""
    from playwright.sync_api import sync_playwright

    pdf = pdf or deck_html.with_suffix(".pdf")
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": SLIDE_WIDTH, "height": SLIDE_HEIGHT})
            page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(("file:", "data:"))
                       else route.abort())
            page.goto(deck_html.resolve().as_uri() + "?print-pdf", wait_until="load", timeout=timeout_s * 1000)
            page.wait_for_function("window.workbenchDeck && window.workbenchDeck.pdfReady",
                                   timeout=timeout_s * 1000)
            page.pdf(path=str(pdf), prefer_css_page_size=True, print_background=True)
        finally:
            browser.close()
    return pdf


def sha256_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()

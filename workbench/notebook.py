"""Kernel-side setup shared by every notebook (the precondition cell calls :func:`setup`).

Two environment switches, read here so notebooks hold no logic:

* ``WORKBENCH_EXPORT=1`` -- the notebook is being executed for an HTML export:
  figures also carry an HTML output that embeds plotly.js once (in the first
  figure) and loads nothing else, so the exported page works offline. (plotly's
  own ``notebook`` renderer pulls MathJax from a CDN for every figure.) Otherwise figures are emitted as plotly's
  JSON mimetype only, which is deterministic (what nbval compares) and small.
* ``WORKBENCH_SMALL=1`` -- CI configuration: notebooks use small sizes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class NotebookSettings:
    """What the precondition cell learned about this run."""

    export: bool
    small: bool
    renderer: str


def env_flag(name: str) -> bool:
    """True when the environment variable ``name`` is set to 1/true/yes."""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def _offline_html_renderer():
    """A plotly renderer: self-contained HTML, plotly.js inlined in the first figure only, no MathJax."""
    import plotly.io as pio
    from plotly.io.base_renderers import MimetypeRenderer

    class OfflineHTMLRenderer(MimetypeRenderer):
        def __init__(self) -> None:
            # plotly shallow-copies a renderer for every display: keep state in a shared dict.
            self.state = {"plotlyjs_sent": False}

        def to_mimebundle(self, fig_dict):
            html = pio.to_html(
                fig_dict, include_plotlyjs=not self.state["plotlyjs_sent"], include_mathjax=False,
                full_html=False, default_width="100%",
            )
            self.state["plotlyjs_sent"] = True
            return {"text/html": html}

    return OfflineHTMLRenderer()


def setup() -> NotebookSettings:
    """Configure plotly's renderer for interactive use, nbval, or export."""
    import plotly.io as pio

    export = env_flag("WORKBENCH_EXPORT")
    pio.renderers["workbench_offline"] = _offline_html_renderer()  # fresh: plotly.js goes out again
    renderer = "plotly_mimetype+workbench_offline" if export else "plotly_mimetype"
    pio.renderers.default = renderer
    return NotebookSettings(export=export, small=env_flag("WORKBENCH_SMALL"), renderer=renderer)


def runs_dir(name: str) -> Path:
    """Where a notebook stores its runs: ``$WORKBENCH_RUNS/name``, else ``<repo>/runs/name`` (git-ignored)."""
    root = os.environ.get("WORKBENCH_RUNS")
    base = Path(root) if root else Path(__file__).resolve().parent.parent / "runs"
    return base / name

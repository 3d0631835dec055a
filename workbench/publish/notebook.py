"""Kernel-side setup shared by every notebook (the precondition cell calls :func:`setup`).

Two environment switches, read here so notebooks hold no logic:

* ``WORKBENCH_EXPORT=1`` -- the notebook is being executed for an HTML export:
  figures also carry an HTML output that embeds plotly.js once (in the first
  figure) and loads nothing else, so the exported page works offline. (plotly's
  own ``notebook`` renderer pulls MathJax from a CDN for every figure.) Otherwise figures are emitted as plotly's
  JSON mimetype only, written by :func:`reader_json` (floats rounded to what a reader sees, plain lists):
  what nbval compares, so it does not change with the last bits of a float or a library's serialisation.
* ``WORKBENCH_SMALL=1`` -- CI configuration: notebooks use small sizes.
* ``WORKBENCH_FULL=1`` -- the full configuration (``build --full``): bigger models, more sizes and steps.
  Neither set: the default configuration, sized so the whole build takes minutes on 2 cores.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from workbench.core import paths
from workbench.core.formats import PLOTLY_MIME

#: The hosts file for cross-host cells, and their launcher (see :attr:`NotebookSettings.hosts`).
HOSTS_ENV, LAUNCHER_ENV = "WORKBENCH_HOSTS", "WORKBENCH_LAUNCHER"


@dataclass(frozen=True)
class NotebookSettings:
    """What the precondition cell learned about this run."""

    export: bool
    small: bool
    renderer: str
    full: bool = False

    @property
    def config(self) -> str:
        """``"small"`` (CI, nbval), ``"full"`` (``build --full``) or ``"default"`` (``build``, and JupyterLab)."""
        return "small" if self.small else "full" if self.full else "default"

    def runs_dir(self, name: str) -> Path:
        """This configuration's run store for ``name`` (:func:`runs_dir` of ``name``, ``name-small`` or
        ``name-full``), so configurations never mix their runs."""
        return runs_dir(name + {"small": "-small", "default": "", "full": "-full"}[self.config])

    @property
    def hosts(self) -> Path | None:
        """The hosts file cross-host cells use: ``$WORKBENCH_HOSTS``, else ``notebooks/hosts.toml`` if it
        exists, else None (runs stay on this machine). A named file that does not exist is an error."""
        named = os.environ.get(HOSTS_ENV, "").strip()
        if named:
            path = Path(named).expanduser()
            if not path.is_file():
                raise ValueError(f"${HOSTS_ENV}={named!r}: no such hosts file.")
            return path
        default = paths.NOTEBOOK_DIR / "hosts.toml"
        return default if default.is_file() else None

    @property
    def launcher(self) -> str:
        """The launcher for :attr:`hosts`: ``$WORKBENCH_LAUNCHER`` (``ssh``, ``mpi`` or ``slurm``), default ``ssh``."""
        return os.environ.get(LAUNCHER_ENV, "").strip() or "ssh"

    def pick(self, *, small, default, full=None):
        """The value for this configuration: ``STEPS = settings.pick(small=20, default=200)``
        (``full`` defaults to ``default``)."""
        return {"small": small, "default": default, "full": default if full is None else full}[self.config]


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


#: Significant digits a stored figure keeps: more than a reader can see on an axis or in a hover label,
#: fewer than the last bits that change with a library's version.
FIGURE_DIGITS = 6


def _round_sig(x: float, digits: int) -> float | None:
    if not math.isfinite(x):
        return None  # what plotly's own JSON encoder writes for NaN and infinities
    return float(f"{x:.{digits}g}")


def reader_json(value, digits: int = FIGURE_DIGITS):
    """``value`` (a figure dict) as plain JSON data a reader would see: every float rounded to ``digits``
    significant digits, NumPy arrays and scalars as lists and numbers (never plotly's base64 ``bdata``,
    a serialisation detail), tuples as lists. Integers, strings and booleans stay as they are.
    """
    import numpy as np

    from workbench.views.widget_sync import decode_typed_array

    if isinstance(value, dict):
        if "bdata" in value and "dtype" in value:  # plotly's typed array: base64 of the raw bytes
            return reader_json(decode_typed_array(value), digits)
        return {str(k): reader_json(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [reader_json(v, digits) for v in value]
    if isinstance(value, np.ndarray):
        return reader_json(value.tolist(), digits)
    if isinstance(value, np.generic):
        return reader_json(value.item(), digits)
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return _round_sig(value, digits)
    import plotly.io as pio  # anything else (dates, decimals): plotly's own encoder, then the same rounding

    return reader_json(json.loads(pio.to_json(value, validate=False)), digits)


def _reader_json_renderer():
    """A plotly renderer: the figure mimetype, as :func:`reader_json` writes it (what nbval compares)."""
    from plotly.io.base_renderers import MimetypeRenderer

    class ReaderJSONRenderer(MimetypeRenderer):
        def to_mimebundle(self, fig_dict):
            return {PLOTLY_MIME: reader_json(fig_dict)}

    return ReaderJSONRenderer()


def setup() -> NotebookSettings:
    """Configure plotly's renderer for interactive use, nbval, or export."""
    import plotly.io as pio

    export = env_flag("WORKBENCH_EXPORT")
    pio.renderers["workbench_json"] = _reader_json_renderer()
    pio.renderers["workbench_offline"] = _offline_html_renderer()  # fresh: plotly.js goes out again
    renderer = "workbench_json+workbench_offline" if export else "workbench_json"
    pio.renderers.default = renderer
    return NotebookSettings(export=export, small=env_flag("WORKBENCH_SMALL"), renderer=renderer,
                            full=env_flag("WORKBENCH_FULL") and not env_flag("WORKBENCH_SMALL"))


def runs_dir(name: str) -> Path:
    """Where a notebook stores its runs: ``$WORKBENCH_RUNS/name``, else ``<repo>/runs/name`` (git-ignored)."""
    root = os.environ.get("WORKBENCH_RUNS")
    base = Path(root) if root else paths.RUNS_DIR
    return base / name

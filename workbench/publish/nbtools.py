"""Exporting and committing notebooks (the main job and notebook upkeep).

* :func:`build_notebooks` -- execute every notebook headless (:mod:`workbench.publish.execute`) with
  ``WORKBENCH_EXPORT=1`` and write self-contained HTML (plotly.js embedded, no
  MathJax or require.js from a CDN) to a build folder.
* :func:`refresh_notebook` -- re-execute a notebook in place and keep it in the form
  nbval checks in CI: outputs kept, widget state and volatile metadata dropped; and in the form
  JupyterLab saves (:mod:`workbench.publish.labsave`), so it opens without the unsaved-changes dot.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

from workbench.core import paths
from workbench.core.events import PROGRESS_ENV
from workbench.publish.buildlog import refuse_name_clashes
from workbench.publish.execute import BuildError, display_path, execute_notebook
from workbench.publish.labsave import save_as_lab_would
from workbench.runs.atomic import WriteError, write_atomic

NOTEBOOK_DIR = paths.NOTEBOOK_DIR
CDN_PATTERN = re.compile(r'<script[^>]+src="(https?://[^"]+)"')


@dataclass(frozen=True)
class BuildResult:
    notebook: Path
    html: Path
    seconds: float
    html_bytes: int


def strip_for_commit(nb) -> None:
    """Drop widget state, execution timing and widget views (they embed random ids)."""
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        cell.outputs = [
            o for o in cell.outputs
            if not (o.get("output_type") in ("display_data", "execute_result")
                    and "application/vnd.jupyter.widget-view+json" in o.get("data", {}))
        ]


def refresh_notebook(path: Path) -> None:
    """Re-execute ``path`` in place in the form nbval checks and JupyterLab saves (see the module docstring)."""
    import nbformat

    nb = execute_notebook(path, WORKBENCH_SMALL="1", WORKBENCH_EXPORT="0")
    strip_for_commit(nb)
    save_as_lab_would(nb)
    write_atomic(path, nbformat.writes(nb) + "\n")  # as nbformat.write; a full disk leaves the notebook as it was


def export_html(nb, out: Path) -> int:
    """Write ``nb`` as HTML that loads nothing from a CDN; returns its size in bytes."""
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(mathjax_url="", require_js_url="")
    html, _ = exporter.from_notebook_node(nb)
    html = re.sub(r'<script[^>]+src=""[^>]*>\s*</script>', "", html)
    remote = CDN_PATTERN.findall(html)
    if remote:
        raise RuntimeError(f"Exported {out.name} would load scripts from the network: {remote}")
    write_atomic(out, html)
    return len(html.encode())


def build_notebooks(out_dir: Path, notebooks: list[Path] | None = None, *, small: bool = False,
                    full: bool = False, progress=None) -> list[BuildResult]:
    """Execute notebooks for export and write their HTML under ``out_dir``.

    Args:
        out_dir: Where each notebook's HTML goes; failing cells' tracebacks go to ``out_dir/../logs``.
        notebooks: Which (default: every numbered notebook).
        small: The CI configuration (``WORKBENCH_SMALL=1``).
        full: The full configuration (``WORKBENCH_FULL=1``: bigger models, more sizes and steps).
        progress: A :class:`workbench.publish.buildlog.ProgressPrinter`, or None for no progress output.

    Runs are stored as they finish (``runs/``, see :func:`workbench.publish.notebook.runs_dir`), so a build
    that is interrupted and started again skips the runs already done.

    Raises:
        BuildError: the first notebook that failed (:func:`execute_notebook`) or whose HTML could not be written.
        ValueError: two notebooks of the same name (:func:`~workbench.publish.buildlog.refuse_name_clashes`).
    """
    paths = list(notebooks or sorted(NOTEBOOK_DIR.glob("[0-9]*.ipynb")))
    refuse_name_clashes(paths, out_dir)  # two report.ipynb would overwrite each other's HTML and logs
    out_dir.mkdir(parents=True, exist_ok=True)
    env = dict(WORKBENCH_EXPORT="1", WORKBENCH_SMALL="1" if small else "0", WORKBENCH_FULL="1" if full else "0")
    if progress is not None:
        env[PROGRESS_ENV] = str(progress.path.resolve())  # the kernel runs in the notebook's folder
    results = []
    for i, path in enumerate(paths, 1):
        t0 = time.perf_counter()
        if progress is not None:
            import nbformat

            num_cells = len(nbformat.read(path, as_version=4).cells)
            progress.notebook_start(Path(path).name, i, len(paths), num_cells)
        nb = execute_notebook(path, progress=progress, log_dir=out_dir.parent / "logs", **env)
        strip_for_commit(nb)  # live widgets need a kernel; their saved state holds plotly's 5 MB widget code
        html = out_dir / (Path(path).stem + ".html")
        try:
            size = export_html(nb, html)
        except WriteError as err:  # a full disk: the notebook ran, its HTML (path named) could not be written
            raise BuildError(f"{display_path(path)}: {err}", notebook=Path(path)) from err
        result = BuildResult(Path(path), html, time.perf_counter() - t0, size)
        if progress is not None:
            progress.notebook_end(result.seconds, f"-> {html} ({size / 2**20:.1f} MiB)")
        results.append(result)
    return results

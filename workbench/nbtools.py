"""Executing, exporting and committing notebooks (the main job and notebook upkeep).

* :func:`build_notebooks` -- execute every notebook headless with
  ``WORKBENCH_EXPORT=1`` and write self-contained HTML (plotly.js embedded, no
  MathJax or require.js from a CDN) to a build folder.
* :func:`refresh_notebook` -- re-execute a notebook in place and keep it in the form
  nbval checks in CI: outputs kept, widget state and volatile metadata dropped.
"""

from __future__ import annotations

import os
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
CDN_PATTERN = re.compile(r'<script[^>]+src="(https?://[^"]+)"')


@dataclass(frozen=True)
class BuildResult:
    notebook: Path
    html: Path
    seconds: float
    html_bytes: int


@contextmanager
def _env(**values: str):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def execute_notebook(path: Path, *, timeout_s: int = 1200, **env: str):
    """Run a notebook top to bottom in a fresh kernel (cwd = its folder) and return it."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    with _env(**env):
        NotebookClient(nb, timeout=timeout_s, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    return nb


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
    """Re-execute ``path`` in place in the form nbval checks (see the module docstring)."""
    import nbformat

    nb = execute_notebook(path, WORKBENCH_SMALL="1", WORKBENCH_EXPORT="0")
    strip_for_commit(nb)
    nbformat.write(nb, path)


def export_html(nb, out: Path) -> int:
    """Write ``nb`` as HTML that loads nothing from a CDN; returns its size in bytes."""
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(mathjax_url="", require_js_url="")
    html, _ = exporter.from_notebook_node(nb)
    html = re.sub(r'<script[^>]+src=""[^>]*>\s*</script>', "", html)
    remote = CDN_PATTERN.findall(html)
    if remote:
        raise RuntimeError(f"Exported {out.name} would load scripts from the network: {remote}")
    out.write_text(html, encoding="utf-8")
    return len(html.encode())


def build_notebooks(out_dir: Path, notebooks: list[Path] | None = None, *, small: bool = False) -> list[BuildResult]:
    """Execute notebooks for export and write their HTML under ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for path in notebooks or sorted(NOTEBOOK_DIR.glob("[0-9]*.ipynb")):
        t0 = time.perf_counter()
        nb = execute_notebook(path, WORKBENCH_EXPORT="1", WORKBENCH_SMALL="1" if small else "0")
        strip_for_commit(nb)  # live widgets need a kernel; their saved state is ~5 MB per FigureWidget
        html = out_dir / (path.stem + ".html")
        size = export_html(nb, html)
        results.append(BuildResult(path, html, time.perf_counter() - t0, size))
    return results

"""Executing, exporting and committing notebooks (the main job and notebook upkeep).

* :func:`build_notebooks` -- execute every notebook headless with
  ``WORKBENCH_EXPORT=1`` and write self-contained HTML (plotly.js embedded, no
  MathJax or require.js from a CDN) to a build folder.
* :func:`refresh_notebook` -- re-execute a notebook in place and keep it in the form
  nbval checks in CI: outputs kept, widget state and volatile metadata dropped; and in the form
  JupyterLab saves (:mod:`workbench.publish.labsave`), so it opens without the unsaved-changes dot.
"""

from __future__ import annotations

import os
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from workbench.core import paths
from workbench.core.events import PROGRESS_ENV
from workbench.publish.buildlog import refuse_name_clashes
from workbench.runs.atomic import WriteError, write_atomic

NOTEBOOK_DIR = paths.NOTEBOOK_DIR
CDN_PATTERN = re.compile(r'<script[^>]+src="(https?://[^"]+)"')


@dataclass(frozen=True)
class BuildResult:
    notebook: Path
    html: Path
    seconds: float
    html_bytes: int


@contextmanager
def scoped_env(**values: str):
    """Set environment variables for the duration of a with block, then restore them (unset if they were)."""
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


class BuildError(Exception):
    """A notebook of the build failed. ``str()`` is one line: which notebook, which cell, which run,
    and why; the full traceback, if any, is in the file ``log``."""

    def __init__(self, message: str, *, notebook: Path, cell_index: int | None = None,
                 run_id: str | None = None, log: Path | None = None, interrupted: bool = False):
        super().__init__(message)
        self.notebook, self.cell_index, self.run_id, self.log, self.interrupted = notebook, cell_index, run_id, log, interrupted


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _first_line(text: str, limit: int = 300) -> str:
    lines = [line.strip() for line in _ANSI.sub("", str(text)).splitlines() if line.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


class _KernelInterrupter:
    """While a notebook runs: SIGINT, SIGTERM and SIGHUP interrupt its kernel, as Ctrl-C in JupyterLab
    would (a run in flight stops its engines and is recorded as failed, its stored steps kept), and the
    cell ends with KeyboardInterrupt; a second signal terminates the kernel. (nbclient's own handlers
    would kill the kernel at once, leaving a run no chance to stop its engines.) Outside a notebook,
    SIGTERM and SIGHUP stop the build like Ctrl-C."""

    def __init__(self, client):
        import signal

        self.client, self.interrupted, self.saved, self.loop = client, False, {}, None
        self.signals = [getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)]
        client.on_notebook_start = self._take_over
        client.on_notebook_complete = self._give_back

    def __enter__(self):
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                if sig != signal.SIGINT:
                    self.saved[sig] = signal.signal(sig, self._raise)
        return self

    def __exit__(self, *exc):
        import signal

        for sig, handler in self.saved.items():
            signal.signal(sig, handler)

    @staticmethod
    def _raise(signum, frame):
        raise KeyboardInterrupt

    def _take_over(self, **_):
        import asyncio

        try:
            self.loop = asyncio.get_running_loop()
            for sig in self.signals:
                self.loop.add_signal_handler(sig, self._handle)
        except (RuntimeError, NotImplementedError, ValueError):  # not the main thread, or no signals here
            self.loop = None

    def _give_back(self, **_):
        if self.loop is not None:
            for sig in self.signals:
                self.loop.remove_signal_handler(sig)
            self.loop = None

    def _handle(self):
        import signal

        process = getattr(getattr(getattr(self.client, "km", None), "provisioner", None), "process", None)
        if process is None:
            return
        try:
            os.kill(process.pid, signal.SIGTERM if self.interrupted else signal.SIGINT)
        except ProcessLookupError:
            pass
        self.interrupted = True


def execute_notebook(path: Path, *, timeout_s: float | None = None, progress=None, log_dir: Path | None = None,
                     **env: str):
    """Run a notebook top to bottom in a fresh kernel (cwd = its folder) and return it.

    Args:
        path: The notebook.
        timeout_s: Longest wait for one cell, or None (the default) for none: a cell that trains runs
            until its runs end, each guarded by its own step watchdog (``run_training``'s
            ``step_timeout_s``), so a run still making progress is never cut off.
        progress: A :class:`workbench.publish.buildlog.ProgressPrinter` told of each cell, or None.
        log_dir: Where a failing cell's full traceback is written (``<notebook stem>.log``).
        env: Environment variables for the kernel (``WORKBENCH_SMALL``, ``WORKBENCH_EXPORT``...).

    Raises:
        BuildError: a cell raised, or a run of the notebook failed; the message names the notebook,
            the cell and the run in one line.
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, DeadKernelError

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    current = {"cell": None}

    def on_cell_start(cell, cell_index):
        current["cell"] = cell_index
        if progress is not None:
            progress.cell_start(cell_index)

    client.on_cell_start = on_cell_start
    # The kernel's own stdout/stderr (its startup warnings, native libraries) go to a file, or nowhere:
    # never into the terminal of the build. What cells print reaches the notebook as usual.
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        kernel_log = open(log_dir / f"{path.stem}.kernel.log", "w", encoding="utf-8")
    else:
        kernel_log = open(os.devnull, "w")
    streams = {"stdout": kernel_log, "stderr": kernel_log}
    with scoped_env(**env), _KernelInterrupter(client) as interrupter:
        try:
            client.execute(**streams)
        except (CellExecutionError, DeadKernelError) as err:
            if progress is not None:
                progress.poll()
            raise _cell_error(path, nb, current["cell"], err, progress, log_dir, interrupter.interrupted) from None
        finally:
            kernel_log.close()
    if progress is not None:
        progress.poll()
        failed = progress.failed_runs
        if failed:
            first = failed[0]
            more = f" (and {len(failed) - 1} more failed runs)" if len(failed) > 1 else ""
            raise BuildError(f"{_display(path)}: run {first.get('run_id')} ({first.get('label')}) failed: "
                             f"{_first_line(first.get('error') or '')}{more}", notebook=path,
                             run_id=first.get("run_id"))
    return nb


def _display(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _cell_error(path: Path, nb, cell_index: int | None, err, progress, log_dir: Path | None,
                interrupted: bool) -> BuildError:
    """One line for a cell that raised: notebook, cell (number and first source line), run, error."""
    cell = nb.cells[cell_index] if cell_index is not None else None
    source = _first_line(next((line for line in (cell.source.splitlines() if cell else [])
                               if line.strip() and not line.lstrip().startswith("#")), ""), 80)
    where = f"{_display(path)}, cell {cell_index + 1 if cell_index is not None else '?'}"
    if source:
        where += f" (`{source}`)"
    run = progress.current_run if progress is not None else {}
    failed = progress.failed_runs if progress is not None else []
    run_id = run.get("run_id") or (failed[-1].get("run_id") if failed else None)
    run_text = ""
    if run:
        run_text = f", run {run.get('run_id')} ({run.get('label')})"
    elif failed:
        run_text = f", after run {failed[-1].get('run_id')} ({failed[-1].get('label')}) failed"
    log = None
    if log_dir is not None:
        try:  # a full disk loses the traceback file, never the one-line error
            log_dir.mkdir(parents=True, exist_ok=True)
            log = write_atomic(log_dir / f"{Path(path).stem}.log", _ANSI.sub("", str(err)))
        except OSError:
            pass
    ename = getattr(err, "ename", type(err).__name__)
    if interrupted or ename == "KeyboardInterrupt":
        return BuildError(f"interrupted in {where}{run_text}", notebook=Path(path), cell_index=cell_index,
                          run_id=run_id, log=log, interrupted=True)
    reason = f"{ename}: {_first_line(getattr(err, 'evalue', None) or str(err))}"
    return BuildError(f"{where}{run_text}: {reason}", notebook=Path(path), cell_index=cell_index, run_id=run_id,
                      log=log)


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

    from workbench.publish.labsave import save_as_lab_would

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
        strip_for_commit(nb)  # live widgets need a kernel; their saved state is ~5 MB per FigureWidget
        html = out_dir / (Path(path).stem + ".html")
        try:
            size = export_html(nb, html)
        except WriteError as err:  # a full disk: the notebook ran, its HTML (path named) could not be written
            raise BuildError(f"{_display(path)}: {err}", notebook=Path(path)) from err
        result = BuildResult(Path(path), html, time.perf_counter() - t0, size)
        if progress is not None:
            progress.notebook_end(result.seconds, f"-> {html} ({size / 2**20:.1f} MiB)")
        results.append(result)
    return results

"""Running one notebook headless in a fresh kernel, and the one-line error when one of its cells fails.

:func:`execute_notebook` is what the build (:mod:`workbench.publish.nbtools`), ``refresh`` and the
slides (:mod:`workbench.publish.slides`) run a notebook with; :class:`BuildError` is how any of them fails.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from workbench.core.envvars import scoped_env
from workbench.runs.atomic import write_atomic


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
            raise BuildError(f"{display_path(path)}: run {first.get('run_id')} ({first.get('label')}) failed: "
                             f"{_first_line(first.get('error') or '')}{more}", notebook=path,
                             run_id=first.get("run_id"))
    return nb


def display_path(path: Path) -> str:
    """``path`` relative to the working directory where it lies under it, else as given."""
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
    where = f"{display_path(path)}, cell {cell_index + 1 if cell_index is not None else '?'}"
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

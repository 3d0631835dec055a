"""Progress events, from the kernel that does long work to the build that shows it.

A notebook executed by ``python -m workbench build`` runs in its own kernel, whose output the build
only sees when a cell ends. So the kernel reports progress through a file: :func:`emit` appends one
JSON line per event to the file named by ``$WORKBENCH_PROGRESS`` (nothing happens when it is unset,
as in JupyterLab or nbval). :class:`workbench.publish.buildlog.ProgressPrinter` follows that file.

Events (each a dict with ``"event"``): ``run_start`` (``index``, ``runs``, ``label``, ``steps``,
``run_id``), ``run_steps`` (``index``, ``runs``, ``done``, ``steps``, ``eta_run_s``, ``eta_sweep_s``)
and ``run_end`` (``index``, ``runs``, ``label``, ``status``, ``seconds``, ``error``, ``run_id``).
``index`` and ``runs`` are None for a run outside a sweep. The build adds notebooks and cells.
"""

from __future__ import annotations

import json
import os
import time

PROGRESS_ENV = "WORKBENCH_PROGRESS"


def emit(event: str, **fields) -> None:
    """Append one progress event for the build that runs this kernel (no-op outside a build)."""
    path = os.environ.get(PROGRESS_ENV)
    if not path:
        return
    line = json.dumps({"event": event, "t": time.time(), **fields}, default=str)
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
    except OSError:  # progress is a courtesy: it never fails the work it reports on
        pass


def format_duration(seconds: float | None) -> str:
    """``95`` -> ``"1 min 35 s"``; None -> ``"?"``."""
    if seconds is None:
        return "?"
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"

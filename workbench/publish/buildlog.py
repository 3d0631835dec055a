"""The build side of progress: :class:`ProgressPrinter` follows the events a notebook's kernel
writes (:mod:`workbench.core.events`) and shows them: one redrawn status line on a terminal, plain
lines flushed as they happen in a log or CI. And what keeps builds apart: :func:`lock_out` (one build
per output folder, issue 24 item 16: two builds sharing ``logs/progress.jsonl`` blamed each other's
runs) and :func:`refuse_name_clashes` (two notebooks that would write the same files, item 17).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from workbench.core.events import format_duration
from workbench.runs.lock import read_record, this_process, try_flock

#: The lock file a build holds in its ``--out`` folder while it runs.
OUT_LOCK = ".build.lock"


class OutInUse(RuntimeError):
    """Another live build holds the output folder; the message names its pid, host, start and command."""


@contextmanager
def lock_out(out: Path, command: str):
    """Hold ``<out>/.build.lock`` (an exclusive ``flock``) for the with block: one build per output folder.

    The kernel lets go of a ``flock`` when its holder dies, however it dies (SIGKILL included), so a
    build that crashed never blocks the next one. The file records the holder for a refusal to name.

    Args:
        out: The build's output folder (made if missing).
        command: The holder's command line, as a refusal shows it.

    Raises:
        OutInUse: a live process holds the folder.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / OUT_LOCK
    fd = try_flock(path, {**this_process().as_dict(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                          "command": command})
    if fd is None:
        held = read_record(path) or {}
        who = (f"process {held.get('pid')} on {held.get('host')}, started {held.get('started')}, "
               f"running `{str(held.get('command'))[:200]}`" if held.get("pid") else "another process")
        raise OutInUse(f"--out {out} is in use by another build ({who}); wait for it to end or stop it, "
                       f"or give this build another --out")
    try:
        yield path
    finally:
        os.close(fd)


def refuse_name_clashes(notebooks: list[Path], out: Path, suffix: str = ".html") -> None:
    """Refuse notebooks that would write the same outputs: the HTML, logs and deck are named by the
    notebook's stem, so ``a/report.ipynb`` and ``b/report.ipynb`` would overwrite each other's.

    Args:
        notebooks: The notebooks of one build.
        out: The folder their outputs go to, ``<out>/<stem><suffix>`` (for the message).
        suffix: The output's suffix, ``.html`` for a build and ``.slides.html`` for a deck.

    Raises:
        ValueError: naming both notebooks (or the one named twice) and the file they share.
    """
    seen: dict[str, Path] = {}
    for path in map(Path, notebooks):
        if path.stem not in seen:
            seen[path.stem] = path
            continue
        first = seen[path.stem]
        if first.resolve() == path.resolve():
            raise ValueError(f"{path} is named twice; name each notebook once")
        raise ValueError(f"{first} and {path} would both write {Path(out) / (path.stem + suffix)} (and the same "
                         f"logs); rename one, or give each its own --out")

#: A log line about a run's steps at most this often (a terminal redraws twice a second).
LOG_EVERY_S = 15.0


@dataclass
class _State:
    notebook: str = ""
    notebook_index: int = 0
    num_notebooks: int = 0
    cell: int | None = None
    num_cells: int = 0
    run: dict = field(default_factory=dict)
    steps: dict = field(default_factory=dict)
    failed: list = field(default_factory=list)


class ProgressPrinter:
    """Shows a build's progress: notebooks, cells, and the runs the kernel reports through :func:`emit`.

    Args:
        progress_file: The file the kernel appends events to (truncated here).
        stream: Where to write (default ``sys.stdout``).
        tty: Redraw one status line (default: whether ``stream`` is a terminal); else plain lines.
    """

    def __init__(self, progress_file: Path, stream: TextIO | None = None, tty: bool | None = None):
        self.path = Path(progress_file)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("")
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty() if tty is None else tty
        self.state = _State()
        self.offset = 0
        self.last_log = 0.0
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None
        self.status_shown = False

    # -- driven by the build ---------------------------------------------------------------------
    def start(self) -> "ProgressPrinter":
        self.thread = threading.Thread(target=self._follow, name="workbench-progress", daemon=True)
        self.thread.start()
        return self

    def close(self) -> None:
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join(timeout=5)
        self.poll()
        self._clear_status()

    def notebook_start(self, name: str, index: int, total: int, num_cells: int) -> None:
        with self.lock:
            s = self.state
            s.notebook, s.notebook_index, s.num_notebooks, s.num_cells, s.cell = name, index, total, num_cells, None
            s.run, s.steps, s.failed = {}, {}, []
            self._line(f"[{index}/{total}] {name}: executing ({num_cells} cells)")

    def cell_start(self, index: int) -> None:
        with self.lock:
            self.state.cell = index
            self._redraw()

    def notebook_end(self, seconds: float, detail: str = "") -> None:
        with self.lock:
            s = self.state
            self._line(f"[{s.notebook_index}/{s.num_notebooks}] {s.notebook}: done in {format_duration(seconds)}"
                       + (f" {detail}" if detail else ""))

    def message(self, text: str) -> None:
        with self.lock:
            self._line(text)

    @property
    def failed_runs(self) -> list[dict]:
        """``run_end`` events of this notebook's runs that failed."""
        return list(self.state.failed)

    @property
    def current_run(self) -> dict:
        """The last ``run_start`` event of this notebook (empty if none)."""
        return dict(self.state.run)

    # -- the kernel's events ---------------------------------------------------------------------
    def _follow(self) -> None:
        while not self.stop_event.wait(0.5):
            self.poll()
            with self.lock:
                self._redraw()

    def poll(self) -> None:
        """Read and show the events appended since the last call."""
        try:
            with open(self.path, encoding="utf-8") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return
        end = chunk.rfind("\n")
        if end < 0:
            return
        self.offset += len(chunk[: end + 1].encode("utf-8"))
        for line in chunk[: end + 1].splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            with self.lock:
                self._on_event(event)

    def _on_event(self, e: dict) -> None:
        s = self.state
        kind = e.get("event")
        where = self._where(e)
        if kind == "run_start":
            s.run, s.steps = e, {}
            steps = f", {e['steps']} steps" if e.get("steps") else ""
            self._line(f"  {where} {e.get('label', '')}: started{steps}")
        elif kind == "run_steps":
            s.steps = e
            now = time.monotonic()
            if not self.tty and now - self.last_log >= LOG_EVERY_S:
                self.last_log = now
                self._line(f"  {where} {s.run.get('label', '')}: {self._steps_text(e)}")
        elif kind == "run_end":
            if e.get("status") == "failed":
                s.failed.append(e)
            text = {"done": f"done in {format_duration(e.get('seconds'))}",
                    "skipped": "already stored: skipped"}.get(e.get("status"), f"FAILED: {e.get('error')}")
            s.run, s.steps = {}, {}
            self._line(f"  {where} {e.get('label', '')}: {text}")

    @staticmethod
    def _where(e: dict) -> str:
        """``"run 3/14"`` inside a sweep, ``"run"`` outside one."""
        return f"run {e['index']}/{e['runs']}" if e.get("index") is not None else "run"

    @staticmethod
    def _steps_text(e: dict) -> str:
        text = f"step {e.get('done', 0)}/{e.get('steps', '?')}"
        if e.get("eta_run_s") is not None:
            text += f", run ends in ~{format_duration(e['eta_run_s'])}"
        if e.get("eta_sweep_s") is not None and e.get("runs"):
            text += f", sweep in ~{format_duration(e['eta_sweep_s'])}"
        return text

    # -- output ------------------------------------------------------------------------------------
    def _status(self) -> str:
        s = self.state
        parts = [f"[{s.notebook_index}/{s.num_notebooks}] {s.notebook}"]
        if s.cell is not None:
            parts.append(f"cell {s.cell + 1}/{s.num_cells}")
        if s.run:
            parts.append(f"{self._where(s.run)} {s.run.get('label', '')}")
            if s.steps and s.steps.get("steps"):
                done, total = s.steps.get("done", 0), s.steps["steps"]
                width = 20
                filled = int(width * min(done, total) / total)
                parts.append("[" + "#" * filled + "." * (width - filled) + "] " + self._steps_text(s.steps))
        return " | ".join(parts)

    def _redraw(self) -> None:
        if not self.tty or not self.state.notebook:
            return
        columns = 160
        try:
            columns = os.get_terminal_size(self.stream.fileno()).columns
        except (OSError, ValueError, AttributeError):
            pass
        self.stream.write("\r\033[K" + self._status()[: max(20, columns - 1)])
        self.stream.flush()
        self.status_shown = True

    def _clear_status(self) -> None:
        if self.tty and self.status_shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.status_shown = False

    def _line(self, text: str) -> None:
        self._clear_status()
        self.stream.write(text + "\n")
        self.stream.flush()
        self._redraw()

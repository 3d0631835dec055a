"""The phases a rank reports as it goes, appended to its run's phases file, and the last one each rank reached.

Below the rank programs (:mod:`workbench.ranks.train_mlx`, :mod:`workbench.ranks.train_jax`) and the entry that
runs them (:mod:`workbench.ranks.entry`), so the programs report without importing their caller. The driver
reads the file to say where a rank that never finished its first step was.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from workbench.runs.store import append_lines

#: A run's phases file: one JSON line per phase a rank enters (:func:`report_phase`).
PHASES_FILE = "phases.jsonl"
PHASE_SPEC, PHASE_JOIN, PHASE_MODEL = "checking the spec and its token file", "joining the other ranks", \
    "building the model"
PHASE_AGREE, PHASE_COMPILE, PHASE_STEP = "comparing plans and starting weights", "compiling the step", \
    "running the first step"
#: In the order a rank goes through them.
PHASES = (PHASE_SPEC, PHASE_JOIN, PHASE_MODEL, PHASE_AGREE, PHASE_COMPILE, PHASE_STEP)


def report_phase(handle, phase: str, rank: int | None = None) -> None:
    """Append ``{rank, phase, attempt, time}`` to the run's :data:`PHASES_FILE` (one ``O_APPEND`` write, as
    the steps); ``rank`` defaults to the engine's ``WORKBENCH_RANK``."""
    rank = int(os.environ.get("WORKBENCH_RANK", -1)) if rank is None else rank
    line = json.dumps({"rank": rank, "phase": phase, "attempt": handle.record.get("attempt", 1),
                       "time": time.time()}) + "\n"
    append_lines(Path(handle.folder) / PHASES_FILE, [line.encode()])


def read_phases(folder: Path, attempt: int) -> dict[int, str]:
    """The last phase each rank of ``attempt`` reported, ``{rank: phase}`` (unreadable lines skipped)."""
    last: dict[int, str] = {}
    try:
        lines = (Path(folder) / PHASES_FILE).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return last
    for line in lines:
        try:
            row = json.loads(line)
            if row.get("attempt") == attempt:
                last[int(row["rank"])] = str(row["phase"])
        except (ValueError, TypeError, KeyError, AttributeError):
            continue
    return last

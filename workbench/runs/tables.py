"""A run store read back as tables: one row per run, one row per (step, rank), and what could not be read."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.runs.schema import record_problem, step_problem
from workbench.runs.store import RECORD_FILE, STEP_KEYS, STEPS_FILE, loads_bounded

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class LoadResult:
    """Everything :func:`load_runs` could read.

    Attributes:
        runs: One row per run; record fields as columns, nested ones flattened with
            dots (``spec.strategy``, ``estimate.peak_memory_bytes``, ``summary.final_loss``).
        steps: Every step row, with its ``run_id``.
        problems: ``(path, reason)`` for each file or line that could not be read.
    """

    runs: pd.DataFrame
    steps: pd.DataFrame
    problems: list[tuple[str, str]]


def read_steps(path: Path, run_id: str = "", problems: list[tuple[str, str]] | None = None, *,
               attempt: int | None = None) -> list[dict[str, Any]]:
    """The step rows of one steps.jsonl; unreadable or ill-typed lines go to ``problems`` (the rest are kept).

    Args:
        path: The ``steps.jsonl``.
        run_id: Added to every row.
        problems: Where ``(path, reason)`` go.
        attempt: Keep only rows of this attempt (rows a stray writer of another attempt appended are
            counted in one problem); ``None`` keeps the attempt of the newest row.
    """
    problems = [] if problems is None else problems
    lines = path.read_bytes().split(b"\n")
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        truncated = i == len(lines) - 1  # no newline after it: the write may have been cut
        try:
            row = loads_bounded(line)
            problem = step_problem(row)
            if problem is not None:
                raise ValueError(problem)
        except ValueError as err:
            where = f"truncated last line {i + 1} (a crash mid-write?)" if truncated else f"unreadable line {i + 1}"
            problems.append((str(path), f"{where} skipped: {err}"))
            continue
        rows.append({"run_id": run_id, **row})
    if attempt is None and rows:
        attempt = max(row.get("attempt", 1) for row in rows)
    others = [r for r in rows if r.get("attempt", attempt) != attempt]
    if others:
        found = sorted({r["attempt"] for r in others})
        problems.append((str(path), f"{len(others)} rows of attempt(s) {found} skipped: the run is at attempt "
                                    f"{attempt} (a writer of an earlier attempt still running?)"))
    return [r for r in rows if r.get("attempt", attempt) == attempt]


def load_runs(root: str | os.PathLike) -> LoadResult:
    """Read every run under ``root`` into pandas DataFrames, reporting what could not be read.

    Each record and step row is checked against :mod:`workbench.runs.schema`. A corrupt, truncated or
    ill-typed ``record.json`` skips that run (and its steps); such a line of ``steps.jsonl`` skips that
    line; rows of another attempt than the record's are skipped. Leftover temp files from an
    interrupted atomic write are ignored. A ``root`` that is not a folder is one problem.
    """
    import pandas as pd

    root = Path(root)
    records, steps, problems = [], [], []
    if not root.is_dir():
        problems.append((str(root), "no such folder" if not root.exists() else "not a folder"))
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) if root.is_dir() else []
    for folder in folders:
        record_path = folder / RECORD_FILE
        try:
            record = loads_bounded(record_path.read_text(encoding="utf-8"))
            problem = record_problem(record, folder.name)
            if problem is not None:
                raise ValueError(problem)
        except FileNotFoundError:
            problems.append((str(record_path), "missing; run skipped"))
            continue
        except (OSError, ValueError) as err:
            problems.append((str(record_path), f"unreadable ({err}); run and its steps skipped"))
            continue
        records.append(record)
        if (folder / STEPS_FILE).is_file():
            steps.extend(read_steps(folder / STEPS_FILE, record["run_id"], problems,
                                    attempt=record.get("attempt", 1)))
    runs = pd.json_normalize(records, sep=".") if records else pd.DataFrame(columns=["run_id", "status"])
    steps_df = pd.DataFrame(steps) if steps else pd.DataFrame(columns=["run_id", *STEP_KEYS])
    return LoadResult(runs=runs, steps=steps_df, problems=problems)

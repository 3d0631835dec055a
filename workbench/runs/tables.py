"""A run store read back as tables: one row per run, one row per (step, rank), and what could not be read."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.runs.store import RECORD_FILE, STEP_KEYS, STEPS_FILE

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


def read_steps(path: Path, run_id: str = "", problems: list[tuple[str, str]] | None = None) -> list[dict[str, Any]]:
    """The step rows of one steps.jsonl; unreadable lines go to ``problems`` (the rest are kept)."""
    problems = [] if problems is None else problems
    lines = path.read_bytes().split(b"\n")
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        truncated = i == len(lines) - 1  # no newline after it: the write may have been cut
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError(f"a JSON {type(row).__name__}, not an object")
        except ValueError as err:
            where = f"truncated last line {i + 1} (a crash mid-write?)" if truncated else f"unreadable line {i + 1}"
            problems.append((str(path), f"{where} skipped: {err}"))
            continue
        rows.append({"run_id": run_id, **row})
    return rows


def load_runs(root: str | os.PathLike) -> LoadResult:
    """Read every run under ``root`` into pandas DataFrames, reporting what could not be read.

    A corrupt or truncated ``record.json`` skips that run (and its steps); a
    truncated or corrupt line of ``steps.jsonl`` skips that line. Leftover temp
    files from an interrupted atomic write are ignored.
    """
    import pandas as pd

    root = Path(root)
    records, steps, problems = [], [], []
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) if root.is_dir() else []
    for folder in folders:
        record_path = folder / RECORD_FILE
        try:
            record = json.loads(record_path.read_text(encoding="utf-8"))
            if not isinstance(record, dict) or not {"run_id", "spec", "status"} <= set(record):
                raise ValueError("not a run record (needs run_id, spec and status)")
        except FileNotFoundError:
            problems.append((str(record_path), "missing; run skipped"))
            continue
        except (OSError, ValueError) as err:
            problems.append((str(record_path), f"unreadable ({err}); run and its steps skipped"))
            continue
        records.append(record)
        if (folder / STEPS_FILE).is_file():
            steps.extend(read_steps(folder / STEPS_FILE, record["run_id"], problems))
    runs = pd.json_normalize(records, sep=".") if records else pd.DataFrame(columns=["run_id", "status"])
    steps_df = pd.DataFrame(steps) if steps else pd.DataFrame(columns=["run_id", *STEP_KEYS])
    return LoadResult(runs=runs, steps=steps_df, problems=problems)

"""The shape of what a run store holds: a record and a step row, checked field by field as they are read.

Each check returns the first thing wrong, in words naming the field (``None`` when all is well), so a
reader can report a bad file or line and load the rest. A small typed schema, standard library only:
every field the tables and figures index into is checked here, so they never meet a string where a
number belongs.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

STATUSES = ("running", "done", "failed")


def _is_int(value: Any, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _is_number(value: Any) -> bool:  # None: a non-finite float as stored (JSON has no NaN)
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and not (
        isinstance(value, float) and math.isinf(value)))


def _is_text(value: Any) -> bool:
    return isinstance(value, str)


def _optional(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or check(value)


#: Record fields: (check, what it must be). ``run_id``, ``spec`` and ``status`` are required.
RECORD_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "run_id": (lambda v: _is_text(v) and bool(v), "a non-empty string"),
    "spec": (lambda v: isinstance(v, dict) and bool(v), "a non-empty object"),
    "status": (lambda v: v in STATUSES, f"one of {', '.join(STATUSES)}"),
    "attempt": (_optional(lambda v: _is_int(v, 1)), "an integer >= 1"),
    "error": (_optional(_is_text), "a string or null"),
    "failed_rank": (_optional(_is_int), "an integer >= 0 or null"),
    "summary": (_optional(lambda v: isinstance(v, dict)), "an object or null"),
    "created_at": (_optional(_is_text), "a string or null"),
    "finished_at": (_optional(_is_text), "a string or null"),
}
REQUIRED_RECORD = ("run_id", "spec", "status")
#: Spec fields the tables label runs by.
SPEC_TEXT_FIELDS = ("framework", "strategy")

#: Step row fields: (check, what it must be). All but ``attempt`` are required.
STEP_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "step": (_is_int, "an integer >= 0"),
    "rank": (_is_int, "an integer >= 0"),
    "attempt": (_optional(lambda v: _is_int(v, 1)), "an integer >= 1"),
    "loss": (_is_number, "a number or null"),
    "grad_norm": (_is_number, "a number or null"),
    "step_time_s": (_is_number, "a number of seconds or null"),
}
REQUIRED_STEP = ("step", "rank", "loss", "grad_norm", "step_time_s")


def _check(value: Any, fields: Mapping[str, tuple[Callable[[Any], bool], str]], required: tuple[str, ...],
           kind: str) -> str | None:
    if not isinstance(value, dict):
        return f"a JSON {type(value).__name__}, not an object"
    missing = [name for name in required if name not in value]
    if missing:
        return f"not a {kind} (lacks {', '.join(missing)})"
    for name, (check, want) in fields.items():
        if name in value and not check(value[name]):
            return f"{name} is {_short(value[name])}, not {want}"
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def record_problem(record: Any, folder_name: str | None = None) -> str | None:
    """What is wrong with a run record, naming the field, or ``None``.

    Args:
        record: The parsed ``record.json``.
        folder_name: The run's folder; a record whose ``run_id`` differs is refused.
    """
    problem = _check(record, RECORD_FIELDS, REQUIRED_RECORD, "run record")
    if problem is not None:
        return problem
    if folder_name is not None and record["run_id"] != folder_name:
        return f"run_id is {record['run_id']!r}, not its folder's name {folder_name!r}"
    for name in SPEC_TEXT_FIELDS:
        if name in record["spec"] and not _is_text(record["spec"][name]):
            return f"spec.{name} is {_short(record['spec'][name])}, not a string"
    return None


def step_problem(row: Any) -> str | None:
    """What is wrong with a step row, naming the field, or ``None``."""
    return _check(row, STEP_FIELDS, REQUIRED_STEP, "step row")

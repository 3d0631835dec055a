"""One label for a run, whatever shape the run comes in: a RunSpec, its dict, or a row of ``load_runs`` (``spec.*``).

``"mlx fsdp-row"``, then what sets the run apart among the runs it is shown with (alone: from the defaults):
``"mlx fsdp-row bfloat16"``, ``"jax ddp communication_size 4.00 MiB"``; and with gradient accumulation
``"mlx fsdp-row G=4 deferred"`` (or ``every micro-batch``). Progress displays, tables and legends all say it
this way (:func:`run_labels` for a set of runs).
"""

from __future__ import annotations

from typing import Any, Mapping

from workbench.core.units import format_bytes
from workbench.runs.estimate import spec_from_row
from workbench.runs.spec import RunSpec

_DEFAULTS = RunSpec.__dataclass_fields__


def run_fields(run: Any) -> dict:
    """A run's spec fields from a RunSpec, a spec dict, or a ``load_runs`` row (``spec.*`` columns)."""
    if isinstance(run, RunSpec):
        return run.to_dict()
    if isinstance(run, Mapping) or hasattr(run, "items"):
        items = dict(run.items())
        return spec_from_row(items) if any(str(k).startswith("spec.") for k in items) else items
    raise ValueError(f"a run is a RunSpec, its dict or a load_runs row, got {type(run).__name__}.")


#: Fields a label names when they set runs apart, with how it says them.
_SAID = {"precision": str, "communication_size": lambda v: f"communication_size {format_bytes(int(v))}"}


def _value(fields: Mapping[str, Any], name: str) -> Any:
    return fields.get(name, _DEFAULTS[name].default)


def run_label(run: Any, among: Any = None) -> str:
    """The run's label: framework and strategy, then the fields of :data:`_SAID` that differ among ``among``
    (runs in any shape; None: the fields that differ from their defaults), then ``G=...`` when G > 1."""
    f = run_fields(run)
    others = [run_fields(r) for r in among] if among is not None else None
    parts = [str(f["framework"]), str(f["strategy"])]
    for name, say in _SAID.items():
        varies = (len({_value(o, name) for o in others}) > 1 if others is not None
                  else _value(f, name) != _DEFAULTS[name].default)
        if varies:
            parts.append(say(_value(f, name)))
    g = f.get("num_microbatches") or 1
    if g > 1:
        defer = f.get("defer_sync", True)
        parts.append(f"G={int(g)} " + ("every micro-batch" if defer is False or defer == 0 else "deferred"))
    return " ".join(parts)


def run_labels(runs: Any) -> list[str]:
    """:func:`run_label` of each run among the others (a ``load_runs(...).runs`` frame, or a list of runs)."""
    rows = [row for _, row in runs.iterrows()] if hasattr(runs, "iterrows") else list(runs)
    return [run_label(row, among=rows) for row in rows]

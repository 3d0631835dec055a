"""Proof of a plan (issue 27): run the pick, the runner-up and DDP for real, and set the models beside them.

:func:`validation_plans` chooses what to run (never a plan the models rule out: DDP only where it fits, else
the smallest plan that keeps the parameters whole); :func:`validate_plan` runs them as ordinary runs
(:func:`workbench.launch.sweep.run_specs`, locally or on the hosts) and reads back each one's measured step
time (the slowest rank's median after warm-up) and peak per rank (the largest rank's ``measured_memory``
peak). Where a prediction misses its 10% target, :func:`off_terms` names the term of the model that was off.

A repeat measures every plan again, in the reverse order (what drifts on the machine falls on each plan alike),
as a run of its own (the same plan, its batches drawn with the next ``data_seed``): each plan's step is the median
of its runs' steps pooled, and its noise the spread of its runs' medians. Whether the pick is faster than the
runner-up, within noise of it, or slower (:attr:`Validation.pick_against_runner_up`) is said from those.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from workbench.launch.sweep import run_specs
from workbench.runs.store import RunStore, run_id_for
from workbench.runs.tables import read_steps
from workbench.strategies import get_strategy
from workbench.studies.planner.advise import PlanAdvice
from workbench.studies.memory import measured_peak
from workbench.studies.planner.candidates import Candidate
from workbench.studies.runs import WARMUP_STEPS

#: A prediction within this share of the measurement meets the target.
TARGET = 0.10


@dataclass(frozen=True, kw_only=True)
class Validated:
    """One plan run for real beside its prediction. ``role``: ``"pick"``, ``"runner-up"``, ``"ddp"``, or
    ``"ddp-like"`` (where no DDP plan fits: the smallest fitting plan that keeps the parameters whole)."""

    candidate: Candidate
    role: str
    run_id: str
    status: str
    measured_step_s: float | None
    measured_sync_s: float | None
    measured_peak_bytes: int | None
    peak_source: str | None
    off: tuple[str, ...] = ()
    repeat_step_s: tuple[float | None, ...] = ()
    repeat_run_ids: tuple[str, ...] = ()

    @property
    def noise_s(self) -> float | None:
        """The spread of its runs' step medians (largest - smallest); None with fewer than two."""
        times = [t for t in self.repeat_step_s if t is not None]
        return max(times) - min(times) if len(times) >= 2 else None

    @property
    def step_error(self) -> float | None:
        """measured / predicted - 1 of the step time."""
        m = self.measured_step_s
        return None if m is None or not self.candidate.predicted_step_s else m / self.candidate.predicted_step_s - 1

    @property
    def peak_error(self) -> float | None:
        m = self.measured_peak_bytes
        return None if m is None else m / self.candidate.predicted_peak_bytes - 1

    def to_dict(self) -> dict:
        return {**self.candidate.to_dict(), "role": self.role, "run_id": self.run_id, "status": self.status,
                "measured_step_s": self.measured_step_s, "measured_sync_s": self.measured_sync_s,
                "measured_peak_bytes": self.measured_peak_bytes, "peak_source": self.peak_source,
                "step_error": self.step_error, "peak_error": self.peak_error, "off": list(self.off),
                "repeat_step_s": list(self.repeat_step_s), "repeat_run_ids": list(self.repeat_run_ids),
                "noise_s": self.noise_s}


def validation_plans(advice: PlanAdvice) -> list[tuple[str, Candidate]]:
    """The pick, the runner-up and DDP (the fastest DDP plan that fits; where none does, the smallest-peak
    fitting plan that keeps the parameters whole), each once, in that order. Plans that do not fit are not run."""
    chosen: list[tuple[str, Candidate]] = []
    fitting = [c for c in advice.candidates if c.fits]
    ddp = [c for c in fitting if get_strategy(c.spec.strategy).family == "data_parallel"]
    whole = sorted((c for c in fitting if not get_strategy(c.spec.strategy).gathers_units),
                   key=lambda c: c.predicted_peak_bytes)
    for role, c in (("pick", advice.recommended), ("runner-up", advice.runner_up),
                    ("ddp", (ddp or [None])[0]), ("ddp-like", None if ddp else (whole or [None])[0])):
        if c is not None and all(c.spec != other.spec for _, other in chosen):
            chosen.append((role, c))
    return chosen


def measured(root: Path, *run_ids: str) -> tuple[float | None, float | None, int | None, str | None,
                                               tuple[float | None, ...]]:
    """Stored runs' step and sync seconds (each step's slowest rank; the median of every run's steps after warm-up,
    pooled), their largest peak, and each run's own step median (its steps alone), read once."""
    rows = [(run_id, r) for run_id in run_ids if (root / run_id / "steps.jsonl").is_file()
            for r in read_steps(root / run_id / "steps.jsonl")]

    def median(column: str, only: str | None = None) -> float | None:
        by_step: dict[tuple[str, int], float] = {}
        for run_id, r in rows:
            if r.get(column) is not None and only in (None, run_id):
                by_step[run_id, r["step"]] = max(by_step.get((run_id, r["step"]), 0.0), float(r[column]))
        kept = [v for (_, s), v in by_step.items() if s >= WARMUP_STEPS] or list(by_step.values())
        return statistics.median(kept) if kept else None

    # a JAX rank's truth (VmHWM) where it read one, else what it stored (studies.memory.measured_peak)
    peaks = [measured_peak(r["measured_memory"])[:2] for run_id in run_ids
             for r in ((RunStore(root).load_record(run_id) or {}).get("summary") or {}).get("ranks") or []
             if (r.get("measured_memory") or {}).get("peak")]
    peak, source = max(peaks) if peaks else (None, None)
    return (median("step_time_s"), median("sync_time_s"), peak, source,
            tuple(median("step_time_s", run_id) for run_id in run_ids))


def off_terms(c: Candidate, step_s: float | None, sync_s: float | None, peak: int | None) -> tuple[str, ...]:
    """The terms of the models that missed the 10% target, e.g. ``"forward and backward 12% over"`` (measured above
    the model) or ``"the sync and update ... underpriced"``. Where the ranks time it (MLX's bucketed steps), the
    step is split where they split it: the forward and backward, then everything after them (the collectives,
    the cost per bucket, the update and the trainer's overhead: ``sync_time_s``)."""
    out = []
    p = c.step
    if step_s is not None and abs(step_s / c.predicted_step_s - 1) > TARGET:
        if sync_s is not None:
            after = p.after_backward_s
            rest = step_s - sync_s
            if after and abs(sync_s / after - 1) > TARGET:
                word = "underpriced" if sync_s > after else "overpriced"
                out.append(f"the sync and update (collectives, per-bucket cost, optimizer, overhead) are {word}: "
                           f"{sync_s * 1e3:.2f} ms measured, {after * 1e3:.2f} ms predicted ({sync_s / after - 1:+.0%}; "
                           f"collectives {p.comm_s * 1e3:.2f} ms of it)")
            if p.compute_s and abs(rest / p.compute_s - 1) > TARGET:
                out.append(f"forward and backward {abs(rest / p.compute_s - 1):.0%} "
                           f"{'over' if rest > p.compute_s else 'under'}: {rest * 1e3:.2f} ms measured, "
                           f"{p.compute_s * 1e3:.2f} ms predicted")
        if not out:
            out.append(f"the step {abs(step_s / c.predicted_step_s - 1):.0%} "
                       f"{'over' if step_s > c.predicted_step_s else 'under'} (no sync time measured to split it)")
    if peak is not None and abs(peak / c.predicted_peak_bytes - 1) > TARGET:
        out.append(f"peak {abs(peak / c.predicted_peak_bytes - 1):.0%} {'over' if peak > c.predicted_peak_bytes else 'under'}"
                   " the memory model (activations and transients are the profiled terms)")
    return tuple(out)


def validate_plan(advice: PlanAdvice, runs_root: str | Path, *, steps: int = 8, repeats: int = 2, hosts: Any = None,
                  launcher: str = "ssh", step_timeout_s: float = 120.0, timeout_s: float = 900.0) -> "Validation":
    """Run :func:`validation_plans` for ``steps`` steps each under ``runs_root`` (ordinary runs; one already stored
    is read, not run again), ``repeats`` times (each repeat in the reverse order of the one before, with the next
    ``data_seed``), and set each beside its prediction.

    Raises:
        ValueError: nothing fits, so nothing is run; ``repeats`` is not a whole number >= 1.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r}: a whole number >= 1 (2 or more says whether the pick is within noise)")
    plans = validation_plans(advice)
    if not plans:
        raise ValueError("no plan fits the memory budget, so none is run: raise --memory, or lower the global batch")
    root = Path(runs_root)
    specs = [[replace(c.spec, steps=steps, data_seed=c.spec.data_seed + r) for _, c in plans] for r in range(repeats)]
    order = [(r, i) for r in range(repeats) for i in (range(len(plans)) if r % 2 == 0 else reversed(range(len(plans))))]
    kwargs = dict(step_timeout_s=step_timeout_s, timeout_s=timeout_s)
    if hosts is not None:
        kwargs.update(hosts=hosts, launcher=launcher)
    outcomes = dict(zip(order, run_specs([specs[r][i] for r, i in order], root, **kwargs)))
    out = []
    for i, (role, c) in enumerate(plans):
        run_ids = tuple(run_id_for(specs[r][i].to_dict()) for r in range(repeats))
        failed = [outcomes[r, i].status for r in range(repeats) if outcomes[r, i].status not in ("done", "skipped")]
        # a plan any of whose runs failed is not measured: one run's figures beside the others' would read as both
        if failed:
            step_s = sync_s = peak = source = None
            per_run = (None,) * repeats
        else:
            step_s, sync_s, peak, source, per_run = measured(root, *run_ids)
        c = replace(c, spec=specs[0][i])
        out.append(Validated(candidate=c, role=role, run_id=run_ids[0], status=failed[0] if failed else "done",
                             measured_step_s=step_s, measured_sync_s=sync_s,
                             measured_peak_bytes=None if peak is None else int(peak), peak_source=source,
                             off=off_terms(c, step_s, sync_s, peak), repeat_run_ids=run_ids,
                             repeat_step_s=per_run))
    return Validation(tuple(out))


@dataclass(frozen=True)
class Validation:
    """The validated plans, in :func:`validation_plans` order."""

    runs: tuple[Validated, ...]

    @property
    def predicted_order(self) -> list[str]:
        return [v.role for v in sorted(self.runs, key=lambda v: v.candidate.predicted_step_s)]

    @property
    def measured_order(self) -> list[str] | None:
        if any(v.measured_step_s is None for v in self.runs):
            return None
        return [v.role for v in sorted(self.runs, key=lambda v: v.measured_step_s)]

    @property
    def order_agrees(self) -> bool | None:
        """The measured order of step times is the predicted one (None: a run has no time)."""
        m = self.measured_order
        return None if m is None else m == self.predicted_order

    @property
    def pick_measured_fastest(self) -> bool | None:
        m = self.measured_order
        return None if m is None else m[0] == "pick"

    @property
    def pick_against_runner_up(self) -> str | None:
        """``"faster"``, ``"within noise"`` or ``"slower"``: the pick's measured step against the runner-up's, where
        both were repeated; within noise where they differ by no more than the larger spread of either one's runs.
        None without a runner-up, a time, or a repeat."""
        roles = {v.role: v for v in self.runs}
        pick, other = roles.get("pick"), roles.get("runner-up")
        if pick is None or other is None or None in (pick.measured_step_s, other.measured_step_s, pick.noise_s,
                                                      other.noise_s):
            return None
        if abs(pick.measured_step_s - other.measured_step_s) <= max(pick.noise_s, other.noise_s):
            return "within noise"
        return "faster" if pick.measured_step_s < other.measured_step_s else "slower"

    def to_dict(self) -> dict:
        return {"validated": [v.to_dict() for v in self.runs], "predicted_order": self.predicted_order,
                "measured_order": self.measured_order, "order_agrees": self.order_agrees,
                "pick_measured_fastest": self.pick_measured_fastest,
                "pick_against_runner_up": self.pick_against_runner_up}

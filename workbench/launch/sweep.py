"""The one sweep: run specs one after another, skipping those stored and done, with progress events and an ETA.

:func:`run_specs` trains each spec through :func:`workbench.launch.driver.run_training` (which skips a spec
already done and records a failure, so the sweep goes on), emits ``run_start``, ``run_steps`` and ``run_end``
events (:func:`workbench.core.events.emit`: what a build's log and a terminal read) and keeps a
:class:`SweepClock` for the time left. A display (``workbench.views.progress``) watches it through a
:class:`SweepWatcher`; the sweep itself shows nothing.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Callable, Iterable, Protocol

from workbench.core.events import emit
from workbench.launch.driver import RunOutcome, run_training
from workbench.launch.pool import EnginePool
from workbench.runs.labels import run_label
from workbench.runs.spec import RunSpec
from workbench.runs.store import RunStore, run_id_for


class SweepClock:
    """Time estimates for a sweep: the current run's remaining steps at its own pace, then the runs left
    at the mean duration of the runs this sweep actually trained (skipped runs cost nothing)."""

    def __init__(self, num_runs: int):
        self.num_runs, self.index = num_runs, 0
        self.trained_s: list[float] = []
        self.run_t0 = self.first_step_t = None
        self.first_step_done = 0

    def run_started(self) -> None:
        self.index += 1
        self.run_t0, self.first_step_t, self.first_step_done = time.monotonic(), None, 0

    def run_ended(self, status: str, seconds: float) -> None:
        if status == "done":
            self.trained_s.append(seconds)

    def eta(self, done: int, steps: int) -> tuple[float | None, float | None]:
        """Seconds left in this run and in the whole sweep (None until a pace is known)."""
        now = time.monotonic()
        if done >= 1 and self.first_step_t is None:
            self.first_step_t, self.first_step_done = now, done
        run_left = None
        if self.first_step_t is not None and done > self.first_step_done:
            pace = (now - self.first_step_t) / (done - self.first_step_done)
            run_left = pace * max(0, steps - done)
        elif done >= steps:
            run_left = 0.0
        runs_left = self.num_runs - self.index
        if run_left is None:
            return None, None
        if self.trained_s:
            per_run = sum(self.trained_s) / len(self.trained_s)
        else:
            per_run = (now - self.run_t0) + run_left if self.run_t0 is not None else None
        return run_left, (run_left + runs_left * per_run if per_run is not None else None)


def all_done(outcomes: Iterable[RunOutcome]) -> bool:
    """Whether every run of a sweep is stored and done (trained now, or skipped as already done)."""
    outcomes = list(outcomes)
    return bool(outcomes) and all(o.status in ("done", "skipped") for o in outcomes)


class SweepWatcher(Protocol):
    """What a display of a sweep is told: a run starts (it may return a callable to be given the steps done as
    they arrive, with the run's and the sweep's seconds left), and a run ends."""

    def run_started(self, spec: RunSpec, label: str) -> Callable[[int, float | None, float | None], None] | None: ...

    def run_ended(self, outcome: RunOutcome) -> None: ...


#: Seconds between two ``run_steps`` events of one run (its last step is always reported).
EVENT_EVERY_S = 0.5


def run_specs(specs: Iterable[RunSpec], runs_root: Path | str, *, watcher: SweepWatcher | None = None,
              train: Callable[..., RunOutcome] = run_training, reuse_engines: bool = True,
              **run_kwargs) -> list[RunOutcome]:
    """Train each spec in turn (``train``: :func:`~workbench.launch.driver.run_training`, given ``run_kwargs``),
    skipping those stored and done, going on after a failure; returns one outcome per spec, in order.

    ``reuse_engines``: consecutive local runs of the same ranks and framework share their engines
    (:class:`~workbench.launch.pool.EnginePool`, stopped when the sweep ends); ``False`` starts fresh ones a run."""
    with contextlib.ExitStack() as scope:
        if reuse_engines and train is run_training and "pool" not in run_kwargs:
            run_kwargs["pool"] = scope.enter_context(EnginePool())
        return _run_each(list(specs), Path(runs_root), watcher, train, run_kwargs)


def _run_each(specs: list[RunSpec], root: Path, watcher: SweepWatcher | None, train: Callable[..., RunOutcome],
              run_kwargs: dict) -> list[RunOutcome]:
    last_event = [0.0]
    clock, outcomes = SweepClock(len(specs)), []
    for spec in specs:
        label = run_label(spec, among=specs)  # what sets it apart in this sweep
        shown = watcher.run_started(spec, label) if watcher is not None else None
        clock.run_started()
        if not RunStore(root).is_done(spec.to_dict()):  # (a stored run is only reported as skipped)
            emit("run_start", index=clock.index, runs=clock.num_runs, label=label, steps=spec.steps,
                 run_id=run_id_for(spec.to_dict()))

        def progress(steps_done: int, spec: RunSpec = spec, shown=shown) -> None:
            eta_run, eta_sweep = clock.eta(steps_done, spec.steps)
            if shown is not None:
                shown(steps_done, eta_run, eta_sweep)
            now = time.monotonic()
            if steps_done and (now - last_event[0] >= EVENT_EVERY_S or steps_done >= spec.steps):
                last_event[0] = now
                emit("run_steps", index=clock.index, runs=clock.num_runs, done=min(steps_done, spec.steps),
                     steps=spec.steps, eta_run_s=eta_run, eta_sweep_s=eta_sweep)

        outcome = train(spec, root, progress=progress, **run_kwargs)
        clock.run_ended(outcome.status, outcome.seconds)
        emit("run_end", index=clock.index, runs=clock.num_runs, label=label, status=outcome.status,
             seconds=outcome.seconds, error=outcome.error, run_id=outcome.run_id)
        if watcher is not None:
            watcher.run_ended(outcome)
        outcomes.append(outcome)
    return outcomes

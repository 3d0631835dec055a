"""Live progress of runs in a notebook: a progress bar and a loss curve that grow as steps arrive.

:func:`run_sweep` runs specs one after another through :func:`workbench.launch.driver.run_training`,
each with a :class:`LiveProgress` display fed by the steps the ranks append to the run store.
The display only reads and draws; the numbers come from the store.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterable

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go

from workbench.core.events import emit, format_duration
from workbench.core.units import format_bytes
from workbench.launch.driver import RunOutcome, run_training
from workbench.runs.spec import RunSpec
from workbench.runs.store import RunStore, run_id_for
from workbench.runs.tables import read_steps
from workbench.views.style import TEMPLATE


class LiveProgress:
    """A progress bar, a status line and a loss curve for one run; call it with the steps done."""

    def __init__(self, spec: RunSpec, runs_root: Path, *, floor_nats: float | None = None, redraw_s: float = 0.5,
                 clock: "SweepClock | None" = None, sweep: "SweepProgress | None" = None):
        self.spec, self.redraw_s, self.last_draw = spec, redraw_s, 0.0
        self.run_id = run_id_for(spec.to_dict())
        self.steps_path = Path(runs_root) / self.run_id / "steps.jsonl"
        self.clock, self.sweep = clock or SweepClock(1), sweep
        self.eta: tuple[float | None, float | None] = (None, None)  # (run, sweep) seconds left
        self.label = spec_label(spec)
        label = f"{spec.framework} {spec.strategy}"
        self.bar = widgets.IntProgress(value=0, min=0, max=spec.steps, description=label,
                                       style={"description_width": "120px"}, layout={"width": "60%"})
        self.status = widgets.HTML("starting engines...")
        # Whole steps only: plotly's automatic ticks read 0.5, 1.5 on a three-step run.
        self.figure = go.FigureWidget(layout=dict(template=TEMPLATE, height=260, margin=dict(t=30, b=30),
                                                  title=f"{label}: loss", yaxis_title="loss",
                                                  xaxis=dict(title="step", tick0=0, dtick=max(1, -(-spec.steps // 10)),
                                                             rangemode="tozero")))
        self.figure.add_scatter(x=[], y=[], mode="lines", name="loss (mean over ranks)")
        if floor_nats is not None:
            self.figure.add_hline(y=floor_nats, line_dash="dash", annotation_text="entropy floor")
        self.widget = widgets.VBox([widgets.HBox([self.bar, self.status]), self.figure])

    def __call__(self, steps_done: int) -> None:
        self.bar.value = min(steps_done, self.spec.steps)
        now = time.monotonic()
        if now - self.last_draw >= self.redraw_s or steps_done >= self.spec.steps:
            self.last_draw = now
            self.eta = eta_run, eta_sweep = self.clock.eta(steps_done, self.spec.steps)
            self.redraw()
            if self.sweep is not None:
                self.sweep.update(self.label, eta_sweep)
            if steps_done:
                emit("run_steps", index=self.clock.index, runs=self.clock.num_runs,
                     done=min(steps_done, self.spec.steps), steps=self.spec.steps, eta_run_s=eta_run,
                     eta_sweep_s=eta_sweep)

    def redraw(self) -> None:
        rows = read_steps(self.steps_path) if self.steps_path.exists() else []
        if not rows:
            return
        curve = pd.DataFrame(rows).groupby("step").loss.mean()
        with self.figure.batch_update():
            self.figure.data[0].x, self.figure.data[0].y = curve.index.tolist(), curve.tolist()
        eta_run, eta_sweep = self.eta
        eta = f", ~{format_duration(eta_run)} left" if eta_run is not None else ""
        if eta_sweep is not None and self.clock.num_runs > 1:
            eta += f" (sweep ~{format_duration(eta_sweep)})"
        self.status.value = f"step {int(curve.index.max()) + 1}/{self.spec.steps}, loss {curve.iloc[-1]:.4f}{eta}"

    def finish(self, outcome: RunOutcome) -> None:
        self.redraw()
        if outcome.status in ("done", "skipped"):  # the last steps may land after the last poll
            self.bar.value = self.bar.max
        self.bar.bar_style = {"done": "success", "skipped": "info"}.get(outcome.status, "danger")
        self.status.value = {"done": f"done in {outcome.seconds:.1f} s", "skipped": "already stored: skipped"}.get(
            outcome.status, f"<b>failed</b>: {outcome.error}")


class SweepProgress:
    """One bar for a whole sweep: runs finished of all, and the sweep's ETA.

    Shown above the runs' own bars, and also pinned to the bottom right of the window
    (``position: fixed``) while the sweep runs, so it stays in sight once Run All has scrolled
    past it (JupyterLab's status bar says "Idle" between a run's cells).
    """

    def __init__(self, num_runs: int):
        self.num_runs, self.finished = num_runs, 0
        self.bar = widgets.IntProgress(value=0, min=0, max=max(num_runs, 1), description=f"sweep of {num_runs}",
                                       style={"description_width": "120px"}, layout={"width": "60%"})
        self.status = widgets.HTML(f"0 of {num_runs} runs done")
        self.pinned = widgets.HTML()
        self.widget = widgets.VBox([widgets.HBox([self.bar, self.status]), self.pinned])

    def update(self, label: str, eta_sweep_s: float | None) -> None:
        eta = f", ~{format_duration(eta_sweep_s)} left" if eta_sweep_s is not None else ""
        self.status.value = f"{self.finished} of {self.num_runs} runs done; now: {label}{eta}"
        self.pinned.value = (f"<div class='workbench-sweep-pinned' style='position:fixed;right:16px;bottom:36px;"
                             f"z-index:1000;background:#FFF3CD;border:1px solid #E0C36A;padding:4px 10px;"
                             f"font-size:12px'>sweep: {self.finished}/{self.num_runs} runs done{eta}</div>")

    def run_finished(self) -> None:
        self.finished += 1
        self.bar.value = self.finished
        self.status.value = f"{self.finished} of {self.num_runs} runs done"
        if self.finished >= self.num_runs:
            self.bar.bar_style, self.pinned.value = "success", ""


def run_sweep(specs: Iterable[RunSpec], runs_root: Path | str, *, display: bool = True,
              floor_nats: float | None = None, **run_kwargs) -> list[RunOutcome]:
    """Run each spec (skipping those already stored and done), showing live progress when ``display``:
    a :class:`SweepProgress` for the whole sweep, then a :class:`LiveProgress` per run."""
    from IPython.display import display as show

    specs = list(specs)
    clock = SweepClock(len(specs))
    sweep = SweepProgress(len(specs))
    if display:
        show(sweep.widget)
    outcomes = []
    for spec in specs:
        live = LiveProgress(spec, Path(runs_root), floor_nats=floor_nats, clock=clock, sweep=sweep)
        if display:
            show(live.widget)
        clock.run_started()
        if not RunStore(Path(runs_root)).is_done(spec.to_dict()):  # (a stored run is only reported as skipped)
            emit("run_start", index=clock.index, runs=clock.num_runs, label=live.label, steps=spec.steps,
                 run_id=live.run_id)
        outcome = run_training(spec, runs_root, progress=live, **run_kwargs)
        clock.run_ended(outcome.status, outcome.seconds)
        emit("run_end", index=clock.index, runs=clock.num_runs, label=live.label, status=outcome.status,
             seconds=outcome.seconds, error=outcome.error, run_id=outcome.run_id)
        live.finish(outcome)
        sweep.run_finished()
        outcomes.append(outcome)
    return outcomes


def all_done(outcomes: Iterable[RunOutcome]) -> bool:
    """Whether every run of a sweep is stored and done (trained now, or skipped as already done)."""
    outcomes = list(outcomes)
    return bool(outcomes) and all(o.status in ("done", "skipped") for o in outcomes)


def spec_label(spec: RunSpec) -> str:
    """A short name for a run in progress displays: framework, strategy and what sets it apart."""
    parts = [spec.framework, spec.strategy]
    if spec.precision != "float32":
        parts.append(spec.precision)
    parts.append(f"communication_size {format_bytes(spec.communication_size)}")
    if spec.num_microbatches > 1:
        parts.append(f"G={spec.num_microbatches} {'deferred' if spec.defer_sync else 'every micro-batch'}")
    return " ".join(parts)


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

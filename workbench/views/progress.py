"""Live progress of runs in a notebook: a progress bar and a loss curve that grow as steps arrive.

:func:`run_sweep` runs specs through the one sweep (:func:`workbench.launch.sweep.run_specs`: skip-done,
progress events, ETA) and watches it: a :class:`SweepProgress` for the whole sweep, and a :class:`LiveProgress`
per run fed by the steps the ranks append to the run store. The display only reads and draws; the numbers
come from the store and the sweep's clock.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterable

import ipywidgets as widgets
import pandas as pd

from workbench.core.events import format_duration
from workbench.core.units import format_seconds
from workbench.launch.driver import RunOutcome
from workbench.launch.sweep import all_done, run_specs
from workbench.runs.labels import run_label
from workbench.runs.spec import RunSpec
from workbench.runs.store import run_id_for
from workbench.runs.tables import read_steps
from workbench.views.figure_widget import FigureWidget
from workbench.views.style import TEMPLATE

__all__ = ["LiveProgress", "SweepProgress", "all_done", "run_sweep"]  # all_done: notebooks import it from here


class LiveProgress:
    """A progress bar, a status line and a loss curve for one run; call it with the steps done (and the
    run's and the sweep's seconds left, from the sweep's clock)."""

    def __init__(self, spec: RunSpec, runs_root: Path, *, floor_nats: float | None = None, redraw_s: float = 0.5,
                 sweep: "SweepProgress | None" = None, label: str | None = None):
        self.spec, self.redraw_s, self.last_draw = spec, redraw_s, 0.0
        self.run_id = run_id_for(spec.to_dict())
        self.steps_path = Path(runs_root) / self.run_id / "steps.jsonl"
        self.sweep = sweep
        self.eta: tuple[float | None, float | None] = (None, None)  # (run, sweep) seconds left
        self.label = label or run_label(spec)
        label = f"{spec.framework} {spec.strategy}"
        self.bar = widgets.IntProgress(value=0, min=0, max=spec.steps, description=label,
                                       style={"description_width": "120px"}, layout={"width": "60%"})
        self.status = widgets.HTML("starting engines...")
        # Whole steps only: plotly's automatic ticks read 0.5, 1.5 on a three-step run.
        self.figure = FigureWidget(layout=dict(template=TEMPLATE, height=260, margin=dict(t=30, b=30),
                                               title=f"{label}: loss", yaxis_title="loss",
                                               xaxis=dict(title="step", tick0=0, dtick=max(1, -(-spec.steps // 10)),
                                                          rangemode="tozero")))
        self.figure.add_scatter(x=[], y=[], mode="lines", name="loss (mean over ranks)")
        if floor_nats is not None:
            self.figure.add_hline(y=floor_nats, line_dash="dash", annotation_text="entropy floor")
        self.widget = widgets.VBox([widgets.HBox([self.bar, self.status]), self.figure])

    def __call__(self, steps_done: int, eta_run_s: float | None = None, eta_sweep_s: float | None = None) -> None:
        self.bar.value = min(steps_done, self.spec.steps)
        self.eta = (eta_run_s, eta_sweep_s)
        now = time.monotonic()
        if now - self.last_draw >= self.redraw_s or steps_done >= self.spec.steps:
            self.last_draw = now
            self.redraw()
            if self.sweep is not None:
                self.sweep.update(self.label, eta_sweep_s)

    def redraw(self) -> None:
        rows = read_steps(self.steps_path) if self.steps_path.exists() else []
        if not rows:
            return
        curve = pd.DataFrame(rows).groupby("step").loss.mean()
        with self.figure.batch_update():
            self.figure.data[0].x, self.figure.data[0].y = curve.index.tolist(), curve.tolist()
        eta_run, eta_sweep = self.eta
        eta = f", ~{format_duration(eta_run)} left" if eta_run is not None else ""
        if eta_sweep is not None and self.sweep is not None and self.sweep.num_runs > 1:
            eta += f" (sweep ~{format_duration(eta_sweep)})"
        self.status.value = f"step {int(curve.index.max()) + 1}/{self.spec.steps}, loss {curve.iloc[-1]:.4f}{eta}"

    def finish(self, outcome: RunOutcome) -> None:
        self.redraw()
        if outcome.status in ("done", "skipped"):  # the last steps may land after the last poll
            self.bar.value = self.bar.max
        self.bar.bar_style = {"done": "success", "skipped": "info"}.get(outcome.status, "danger")
        self.status.value = {"done": f"done in {format_seconds(outcome.seconds)}", "skipped": "already stored: skipped"}.get(
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


class _Display:
    """The sweep's watcher in a notebook: the sweep's bar, and each run's bar and curve as it starts."""

    def __init__(self, num_runs: int, runs_root: Path, floor_nats: float | None, show):
        self.sweep, self.runs_root, self.floor_nats, self.show = SweepProgress(num_runs), runs_root, floor_nats, show
        self.live: LiveProgress | None = None
        if show is not None:
            show(self.sweep.widget)

    def run_started(self, spec: RunSpec, label: str) -> LiveProgress:
        self.live = LiveProgress(spec, self.runs_root, floor_nats=self.floor_nats, sweep=self.sweep, label=label)
        if self.show is not None:
            self.show(self.live.widget)
        return self.live

    def run_ended(self, outcome: RunOutcome) -> None:
        self.live.finish(outcome)
        self.sweep.run_finished()


def run_sweep(specs: Iterable[RunSpec], runs_root: Path | str, *, display: bool = True,
              floor_nats: float | None = None, **run_kwargs) -> list[RunOutcome]:
    """Run each spec (skipping those already stored and done: :func:`workbench.launch.sweep.run_specs`), showing
    live progress when ``display``: a :class:`SweepProgress` for the whole sweep, then a :class:`LiveProgress`
    per run."""
    from IPython.display import display as show

    specs = list(specs)
    watcher = _Display(len(specs), Path(runs_root), floor_nats, show if display else None)
    return run_specs(specs, runs_root, watcher=watcher, **run_kwargs)

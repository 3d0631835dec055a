"""Live progress of runs in a notebook: a progress bar and a loss curve that grow as steps arrive.

:func:`run_sweep` runs specs one after another through :func:`workbench.training.run_training`,
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

from .figures import TEMPLATE
from .runstore import read_steps, run_id_for
from .training import RunOutcome, RunSpec, run_training


class LiveProgress:
    """A progress bar, a status line and a loss curve for one run; call it with the steps done."""

    def __init__(self, spec: RunSpec, runs_root: Path, *, floor_nats: float | None = None, redraw_s: float = 0.5):
        self.spec, self.redraw_s, self.last_draw = spec, redraw_s, 0.0
        self.steps_path = Path(runs_root) / run_id_for(spec.to_dict()) / "steps.jsonl"
        label = f"{spec.framework} {spec.strategy}"
        self.bar = widgets.IntProgress(value=0, min=0, max=spec.steps, description=label,
                                       style={"description_width": "120px"}, layout={"width": "60%"})
        self.status = widgets.HTML("starting engines...")
        self.figure = go.FigureWidget(layout=dict(template=TEMPLATE, height=260, margin=dict(t=30, b=30),
                                                  title=f"{label}: loss", xaxis_title="step", yaxis_title="loss"))
        self.figure.add_scatter(x=[], y=[], mode="lines", name="loss (mean over ranks)")
        if floor_nats is not None:
            self.figure.add_hline(y=floor_nats, line_dash="dash", annotation_text="entropy floor")
        self.widget = widgets.VBox([widgets.HBox([self.bar, self.status]), self.figure])

    def __call__(self, steps_done: int) -> None:
        self.bar.value = min(steps_done, self.spec.steps)
        now = time.monotonic()
        if now - self.last_draw >= self.redraw_s or steps_done >= self.spec.steps:
            self.last_draw = now
            self.redraw()

    def redraw(self) -> None:
        rows = read_steps(self.steps_path) if self.steps_path.exists() else []
        if not rows:
            return
        curve = pd.DataFrame(rows).groupby("step").loss.mean()
        with self.figure.batch_update():
            self.figure.data[0].x, self.figure.data[0].y = curve.index.tolist(), curve.tolist()
        self.status.value = f"step {int(curve.index.max()) + 1}/{self.spec.steps}, loss {curve.iloc[-1]:.4f}"

    def finish(self, outcome: RunOutcome) -> None:
        self.redraw()
        self.bar.bar_style = {"done": "success", "skipped": "info"}.get(outcome.status, "danger")
        self.status.value = {"done": f"done in {outcome.seconds:.1f} s", "skipped": "already stored: skipped"}.get(
            outcome.status, f"<b>failed</b>: {outcome.error}")


def run_sweep(specs: Iterable[RunSpec], runs_root: Path | str, *, display: bool = True,
              floor_nats: float | None = None, **run_kwargs) -> list[RunOutcome]:
    """Run each spec (skipping those already stored and done), showing live progress when ``display``."""
    outcomes = []
    for spec in specs:
        live = LiveProgress(spec, Path(runs_root), floor_nats=floor_nats)
        if display:
            from IPython.display import display as show

            show(live.widget)
        outcome = run_training(spec, runs_root, progress=live, **run_kwargs)
        live.finish(outcome)
        outcomes.append(outcome)
    return outcomes

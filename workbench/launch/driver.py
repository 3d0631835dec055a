"""The driver of a training run on real engines.

:func:`run_training` plans the launch, starts engines, sends them :func:`workbench.ranks.entry.train_rank`,
watches progress, and records the outcome: done, or failed with the error and the rank at fault. A step
that does not finish within ``step_timeout_s`` (a hung collective, MLX #4475) fails the run instead of
hanging the notebook.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from workbench.launch.engines import EngineFailure, EngineRun
from workbench.launch.remote import runner_for
from workbench.ranks.entry import train_rank
from workbench.runs.spec import RunSpec
from workbench.runs.store import RunStore


@dataclass(frozen=True)
class RunOutcome:
    """What became of a run: ``status`` is "done", "failed" or "skipped" (already done)."""

    run_id: str
    status: str
    error: str | None = None
    rank: int | None = None
    seconds: float = 0.0
    engines_ready_s: float = 0.0


class StepWatchdog:
    """Fails a run whose steps stop arriving (polls the size of its steps file, cheaply)."""

    def __init__(self, steps_path: Path, step_timeout_s: float, startup_timeout_s: float,
                 progress: Callable[[int], None] | None = None, num_ranks: int = 1):
        self.path, self.step_timeout_s, self.startup_timeout_s = steps_path, step_timeout_s, startup_timeout_s
        self.progress, self.num_ranks = progress, num_ranks
        self.size, self.lines, self.last_change = -1, 0, time.monotonic()

    def __call__(self) -> None:
        size = self.path.stat().st_size if self.path.exists() else 0
        now = time.monotonic()
        if size != self.size:
            self.size, self.last_change = size, now
            self.lines = self.path.read_bytes().count(b"\n") if size else 0
            if self.progress is not None:
                self.progress(self.lines // self.num_ranks)
            return
        limit = self.step_timeout_s if self.lines else self.startup_timeout_s
        if now - self.last_change > limit:
            step = self.lines // self.num_ranks
            raise EngineFailure(
                f"no step finished for {limit:.0f} s after step {step - 1 if step else 'start'} "
                f"(a hung collective? MLX ring all_sum is known to deadlock, MLX #4475); engines stopped", None)


def _has_steps(steps_path: Path) -> bool:
    return steps_path.exists() and steps_path.stat().st_size > 0


def run_training(spec: RunSpec, runs_root: Path | str, *, step_timeout_s: float = 60.0, startup_timeout_s: float = 180.0,
                 timeout_s: float = 3600.0, progress: Callable[[int], None] | None = None,
                 on_engines: Callable[[EngineRun], None] | None = None, skip_done: bool = True,
                 hosts=None, launcher: str = "ssh") -> RunOutcome:
    """Run ``spec`` on ``spec.num_ranks`` local engines and record it under ``runs_root``.

    Args:
        spec: The run (already validated: a bad spec never reaches an engine).
        runs_root: The run store's folder.
        step_timeout_s: Longest wait for the next step once the first has finished.
        startup_timeout_s: Longest wait for the first step (imports, compilation).
        timeout_s: Longest wait for the whole run.
        progress: Called with the number of steps every rank has finished, as they arrive.
        on_engines: Called with the started engines (tests use it to inject faults).
        skip_done: Return at once if the store already holds this spec, done.
        hosts: ``None``: engines on this machine. Else a hosts file (its path, or
            :func:`workbench.launch.hosts.load_hosts`'s result): engines on those hosts, and every
            rank's result in the record names its host (``"placement"``).
        launcher: With ``hosts``: ipyparallel's ``"ssh"``, ``"mpi"`` or ``"slurm"`` launcher.

    Returns:
        A :class:`RunOutcome`; a failed run is recorded as failed (steps kept), not raised.
    """
    runner = runner_for(hosts, launcher)  # a bad hosts file or launcher is refused before the record exists
    store = RunStore(Path(runs_root))
    spec_dict = spec.to_dict()
    if skip_done and store.is_done(spec_dict):
        from workbench.runs.store import run_id_for

        return RunOutcome(run_id_for(spec_dict), "skipped")
    from workbench.runs.estimate import estimate_run_memory

    handle = store.create(spec_dict, meta={"backend": "ring" if spec.framework == "mlx" else "gloo",
                                           "memory_estimate": estimate_run_memory(spec).as_dict()})
    t0 = time.monotonic()
    steps_path = handle.folder / "steps.jsonl"

    def train(engines: EngineRun) -> tuple[list, float]:
        if on_engines is not None:
            on_engines(engines)
        watchdog = StepWatchdog(steps_path, step_timeout_s, startup_timeout_s, progress, spec.num_ranks)
        return (engines.apply(train_rank, [(spec_dict, str(store.root), handle.run_id)] * spec.num_ranks,
                              timeout_s=timeout_s, on_poll=watchdog, poll_s=0.1), engines.started_s)

    try:
        results, ready_s = runner(spec.num_ranks, spec.framework, train, may_retry=lambda: not _has_steps(steps_path))
    except EngineFailure as err:
        handle.fail(str(err), err.rank)
        return RunOutcome(handle.run_id, "failed", str(err), err.rank, time.monotonic() - t0)
    except BaseException as err:  # interrupted: recorded, then re-raised
        handle.fail(f"{type(err).__name__}: {err}", None)
        raise
    handle.finish({"ranks": results, "engines_ready_s": ready_s})
    return RunOutcome(handle.run_id, "done", seconds=time.monotonic() - t0, engines_ready_s=ready_s)

"""The driver of a training run on real engines.

:func:`run_training` plans the launch, starts engines, sends them :func:`workbench.ranks.entry.train_rank`,
watches progress, and records the outcome: done, or failed with the error and the rank at fault. A step
that does not finish within ``step_timeout_s`` (a hung collective, MLX #4475) fails the run instead of
hanging the notebook.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from workbench.launch.engines import EngineFailure, EngineRun, run_on_fresh_ports
from workbench.launch.remote import runner_for
from workbench.ranks.entry import train_rank
from workbench.runs.factory import import_paths
from workbench.runs.spec import RunSpec
from workbench.runs.store import RunStore, run_id_for


@dataclass(frozen=True)
class RunOutcome:
    """What became of a run: ``status`` is "done", "failed" or "skipped" (already done).

    ``recovered`` says what the run found and marked failed first: an earlier attempt left running by a
    driver that died (``"driver died: ..."``), else ``None``.
    """

    run_id: str
    status: str
    error: str | None = None
    rank: int | None = None
    seconds: float = 0.0
    engines_ready_s: float = 0.0
    recovered: str | None = None


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


def check_run_knobs(spec: Any, runs_root: Any, **seconds: Any) -> None:
    """Refuse bad :func:`run_training` arguments before anything starts, naming the one at fault.

    Raises:
        ValueError: ``spec`` is not a :class:`RunSpec` (a dict: build one with ``RunSpec(**d)``),
            ``runs_root`` is not a non-empty path, or one of ``seconds`` is not a finite number > 0.
    """
    if not isinstance(spec, RunSpec):
        hint = " (build one with RunSpec(**spec))" if isinstance(spec, Mapping) else ""
        raise ValueError(f"spec must be a RunSpec, got {type(spec).__name__}{hint}.")
    if not isinstance(runs_root, (str, os.PathLike)) or not os.fspath(runs_root).strip():
        raise ValueError(f"runs_root={runs_root!r}: must be a non-empty path to the run store's folder.")
    for name, value in seconds.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name}={value!r}: must be a finite number of seconds > 0.")


def run_training(spec: RunSpec, runs_root: Path | str, *, step_timeout_s: float = 60.0, startup_timeout_s: float = 180.0,
                 timeout_s: float = 3600.0, progress: Callable[[int], None] | None = None,
                 on_engines: Callable[[EngineRun], None] | None = None, skip_done: bool = True,
                 hosts: Any = None, launcher: str = "ssh") -> RunOutcome:
    """Run ``spec`` on ``spec.num_ranks`` local engines and record it under ``runs_root``.

    The run is owned by this process while it runs (:mod:`workbench.runs.lock`); if the driver dies,
    the engines and controller it started die with it (:mod:`workbench.launch.reaper`), and the next
    call marks the attempt left running ``"failed"`` (``RunOutcome.recovered`` says so) and redoes it.

    Args:
        spec: The run (already validated: a bad spec never reaches an engine).
        runs_root: The run store's folder.
        step_timeout_s: Longest wait for the next step once the first has finished, in seconds.
        startup_timeout_s: Longest wait for the first step (imports, compilation), in seconds.
        timeout_s: Longest wait for the whole run, in seconds.
        progress: Called with the number of steps every rank has finished, as they arrive.
        on_engines: Called with the started engines (tests use it to inject faults).
        skip_done: Return at once if the store already holds this spec, done. ``False`` redoes a done
            run: its attempt moves to ``<run>/attempts/<n>/`` and a fresh one starts.
        hosts: ``None``: engines on this machine. Else a hosts file (its path, or
            :func:`workbench.launch.hosts.load_hosts`'s result): engines on those hosts, and every
            rank's result in the record names its host (``"placement"``).
        launcher: With ``hosts``: ipyparallel's ``"ssh"``, ``"mpi"`` or ``"slurm"`` launcher.

    Returns:
        A :class:`RunOutcome`; a failed run is recorded as failed (steps kept), not raised.

    Raises:
        ValueError: a bad argument (named), before anything starts.
        RunLocked: another live process is running this spec on this store (named by pid).
    """
    check_run_knobs(spec, runs_root, step_timeout_s=step_timeout_s, startup_timeout_s=startup_timeout_s,
                    timeout_s=timeout_s)
    for name, fn in (("progress", progress), ("on_engines", on_engines)):
        if fn is not None and not callable(fn):
            raise ValueError(f"{name}={fn!r}: must be callable or None.")
    runner = runner_for(hosts, launcher)  # a bad hosts file or launcher is refused before the record exists
    store = RunStore(Path(runs_root))
    spec_dict = spec.to_dict()
    if skip_done and store.is_done(spec_dict):
        return RunOutcome(run_id_for(spec_dict), "skipped")
    from workbench.ranks.user_model import check_user_run
    from workbench.runs.estimate import estimate_run_memory

    user_model = check_user_run(spec)  # a user's factory and data, checked here, before any engine starts
    meta = {} if user_model is None else {"model_shapes": [[p.path, list(p.shape), p.dtype] for p in user_model.params]}
    backend = "none" if spec.num_ranks == 1 and spec.framework == "mlx" else "ring" if spec.framework == "mlx" else "gloo"
    meta.update(backend=backend, memory_estimate=estimate_run_memory(spec, user_model).as_dict())
    handle = store.create(spec_dict, meta=meta,
                          overwrite=not skip_done)
    try:
        return _run(spec, spec_dict, store, handle, step_timeout_s, startup_timeout_s, timeout_s, progress, on_engines,
                    runner)
    finally:
        handle.release()


def _run(spec, spec_dict, store, handle, step_timeout_s, startup_timeout_s, timeout_s, progress, on_engines,
         runner=run_on_fresh_ports) -> RunOutcome:
    t0 = time.monotonic()
    steps_path = handle.folder / "steps.jsonl"
    recovered = handle.recovered

    def train(engines: EngineRun) -> tuple[list, float]:
        if on_engines is not None:
            on_engines(engines)
        watchdog = StepWatchdog(steps_path, step_timeout_s, startup_timeout_s, progress, spec.num_ranks)
        paths = tuple(import_paths())  # the user's factory imports on the engines as here
        return (engines.apply(train_rank, [(spec_dict, str(store.root), handle.run_id, paths)] * spec.num_ranks,
                              timeout_s=timeout_s, on_poll=watchdog, poll_s=0.1), engines.started_s)

    try:
        results, ready_s = runner(spec.num_ranks, spec.framework, train, may_retry=lambda: not _has_steps(steps_path))
    except EngineFailure as err:
        handle.fail(str(err), err.rank)
        return RunOutcome(handle.run_id, "failed", str(err), err.rank, time.monotonic() - t0, recovered=recovered)
    except BaseException as err:  # interrupted: recorded, then re-raised
        handle.fail(f"{type(err).__name__}: {err}", None)
        raise
    handle.finish({"ranks": results, "engines_ready_s": ready_s})
    return RunOutcome(handle.run_id, "done", seconds=time.monotonic() - t0, engines_ready_s=ready_s, recovered=recovered)

"""The driver of a training run on real engines.

:func:`run_training` plans the launch, starts engines, sends them :func:`workbench.ranks.entry.train_rank`,
watches progress, and records the outcome: done, or failed with the error and the rank at fault. A step
that does not finish within ``step_timeout_s`` (a hung collective, MLX #4475) fails the run instead of
hanging the notebook; a run with no step within ``startup_timeout_s`` fails naming what each rank was
still doing (the phases of :mod:`workbench.ranks.entry`: building the model, compiling, ...). A user's
model is first built here in a subprocess (:func:`build_user_model`), so ``timeout_s`` bounds it too.
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from workbench.launch.engines import EngineFailure, EngineRun
from workbench.launch.pool import EnginePool
from workbench.launch.remote import Placement
from workbench.ranks.entry import train_rank
from workbench.ranks.phases import PHASE_MODEL, PHASE_STEP, PHASES, read_phases
from workbench.ranks.shared_compile import compile_folder
from workbench.runs.factory import import_paths
from workbench.runs.spec import RunSpec
from workbench.runs.store import RunStore, run_id_for


@dataclass(frozen=True)
class RunOutcome:
    """What became of a run: ``status`` is "done", "failed" or "skipped" (already done). ``recovered`` says what
    the run found and marked failed first: an earlier attempt left running by a driver that died
    (``"driver died: ..."``), else ``None``."""

    run_id: str
    status: str
    error: str | None = None
    rank: int | None = None
    seconds: float = 0.0
    engines_ready_s: float = 0.0
    recovered: str | None = None


class StepWatchdog:
    """Fails a run whose steps stop arriving (polls the size of its steps file, cheaply).

    ``describe_start()``, if given, says what the ranks were doing when no step came within
    ``startup_timeout_s`` (:func:`describe_phases`).
    """

    def __init__(self, steps_path: Path, step_timeout_s: float, startup_timeout_s: float,
                 progress: Callable[[int], None] | None = None, num_ranks: int = 1,
                 describe_start: Callable[[float], str] | None = None):
        self.path, self.step_timeout_s, self.startup_timeout_s = steps_path, step_timeout_s, startup_timeout_s
        self.progress, self.num_ranks, self.describe_start = progress, num_ranks, describe_start
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
            if not self.lines and self.describe_start is not None:
                failure = EngineFailure(f"no step finished within {limit:.0f} s of the start: "
                                        f"{self.describe_start(limit)}; engines stopped", None)
                failure.phases_told = True
                raise failure
            raise EngineFailure(
                f"no step finished for {limit:.0f} s after step {step - 1 if step else 'start'} "
                f"(a hung collective? MLX ring all_sum is known to deadlock, MLX #4475); engines stopped", None)


def describe_phases(phases: Mapping[int, str], num_ranks: int, factory: str | None, limit_s: float) -> str:
    """What the ranks were doing, from the last phase each reported (:func:`workbench.ranks.entry.read_phases`),
    the furthest behind first: a slow model factory, named, is told apart from a hung first step and from
    ranks that never began."""
    groups: dict[str | None, list[int]] = {}
    for rank in range(num_ranks):
        groups.setdefault(phases.get(rank), []).append(rank)
    parts = []
    for phase, ranks in sorted(groups.items(), key=lambda g: PHASES.index(g[0]) + 1 if g[0] in PHASES else 0):
        if phase is None:
            parts.append(f"ranks {ranks} had not begun the run (their engines busy, or still importing)")
        elif phase == PHASE_MODEL and factory is not None:
            parts.append(f"the model factory {factory!r} did not return within {limit_s:.0f} s on ranks {ranks}")
        elif phase == PHASE_STEP:
            parts.append(f"ranks {ranks} were in their first step (a hung collective? MLX ring all_sum is known "
                         "to deadlock, MLX #4475)")
        else:
            parts.append(f"ranks {ranks} were {phase}")
    return "; ".join(parts)


def build_user_model(spec: RunSpec, timeout_s: float) -> Any:
    """The user model's :class:`~workbench.core.specs.ModelSpec`, built in a subprocess bounded by ``timeout_s``.

    ``python -m workbench.ranks.entry`` builds it as an engine would (same folders on ``sys.path``, same
    seeding, the same checks: :func:`workbench.ranks.user_model.user_model_spec`). A subprocess, not a
    thread: it can be stopped at the deadline, a factory that crashes or calls ``os._exit`` cannot take
    the driver (a notebook's kernel) with it, and seeding leaves the driver's own generators alone. Its
    output is passed on to this process's stderr.

    Raises:
        ValueError: what the check raised (naming the factory), or the process ended without a result.
        TimeoutError: the factory did not return within ``timeout_s`` (the process is killed).
    """
    # Output to files, not pipes: a process the factory starts and leaves running would hold a pipe open
    # and keep a reader waiting past the check. The check runs in a session of its own, ended with it.
    with tempfile.TemporaryFile() as out_file, tempfile.TemporaryFile() as err_file:
        child = subprocess.Popen([sys.executable, "-m", "workbench.ranks.entry"], stdin=subprocess.PIPE,
                                 stdout=out_file, stderr=err_file, start_new_session=True)
        try:
            child.communicate(pickle.dumps((spec, import_paths())), timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"the model factory {spec.model_factory!r} did not return within {timeout_s:.1f} s "
                               "in the driver's check, before any engine started (its subprocess was stopped; "
                               "nothing was stored)") from None
        finally:  # done, timed out or interrupted: nothing the check started outlives this call
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        out = (out_file.seek(0), out_file.read())[1]
        text = (err_file.seek(0), err_file.read())[1].decode("utf-8", "replace")
    if text:
        sys.stderr.write(text)
    try:
        status, value = pickle.loads(out)
    except Exception:
        code = child.returncode
        how = f"exit code {code}" if code >= 0 else f"signal {-code}" if -code not in signal.valid_signals() \
            else f"signal {signal.Signals(-code).name}"
        raise ValueError(f"RunSpec.model_factory={spec.model_factory!r}: the driver's check process, which builds "
                         f"the model, ended ({how}) without a result; its output ended:\n{text[-1500:]}") from None
    if status != "ok":
        raise ValueError(value)
    return value


def _has_steps(steps_path: Path) -> bool:
    return steps_path.exists() and steps_path.stat().st_size > 0


@dataclass(frozen=True)
class RunLimits:
    """The three bounds of a run, in seconds (each a finite number > 0, checked here, naming the one at fault).

    Attributes:
        step_timeout_s: Longest wait for the next step once the first has finished.
        startup_timeout_s: Longest wait for the first step (imports, compilation); on other hosts, also for their
            engines to start, before that wait.
        timeout_s: Longest wait for the whole run, from :func:`run_training`'s call: building a user's model
            there (:func:`build_user_model`) counts, and so does every engine's run.
    """

    step_timeout_s: float = 60.0
    startup_timeout_s: float = 180.0
    timeout_s: float = 3600.0

    def __post_init__(self) -> None:
        for name in ("step_timeout_s", "startup_timeout_s", "timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name}={value!r}: must be a finite number of seconds > 0.")


def check_run_knobs(spec: Any, runs_root: Any) -> None:
    """Refuse bad :func:`run_training` arguments before anything starts, naming the one at fault.

    Raises:
        ValueError: ``spec`` is not a :class:`RunSpec` (a dict: build one with ``RunSpec(**d)``), or
            ``runs_root`` is not a non-empty path.
    """
    if not isinstance(spec, RunSpec):
        hint = " (build one with RunSpec(**spec))" if isinstance(spec, Mapping) else ""
        raise ValueError(f"spec must be a RunSpec, got {type(spec).__name__}{hint}.")
    if not isinstance(runs_root, (str, os.PathLike)) or not os.fspath(runs_root).strip():
        raise ValueError(f"runs_root={runs_root!r}: must be a non-empty path to the run store's folder.")


@dataclass(frozen=True)
class _Attempt:
    """One attempt of a run, recorded and about to start: what the engines need, and what watches them."""

    spec: RunSpec
    store: RunStore
    handle: Any
    limits: RunLimits
    deadline: float
    progress: Callable[[int], None] | None
    on_engines: Callable[[EngineRun], None] | None
    runner: Callable[..., Any]
    local: bool  # every rank on this machine: a JAX run's ranks compile their step once (ranks.shared_compile)


def run_training(spec: RunSpec, runs_root: Path | str, *, step_timeout_s: float = 60.0, startup_timeout_s: float = 180.0,
                 timeout_s: float = 3600.0, progress: Callable[[int], None] | None = None,
                 on_engines: Callable[[EngineRun], None] | None = None, skip_done: bool = True,
                 hosts: Any = None, launcher: str = "ssh", pool: EnginePool | None = None) -> RunOutcome:
    """Run ``spec`` on ``spec.num_ranks`` local engines and record it under ``runs_root``.

    The run is owned by this process while it runs (:mod:`workbench.runs.lock`); if the driver dies,
    the engines and controller it started die with it (:mod:`workbench.launch.reaper`), and the next
    call marks the attempt left running ``"failed"`` (``RunOutcome.recovered`` says so) and redoes it.

    Args:
        spec: The run (already validated: a bad spec never reaches an engine).
        runs_root: The run store's folder.
        step_timeout_s, startup_timeout_s, timeout_s: The run's bounds in seconds (:class:`RunLimits`).
        progress: Called with the number of steps every rank has finished, as they arrive.
        on_engines: Called with the started engines (tests use it to inject faults).
        skip_done: Return at once if the store already holds this spec, done. ``False`` redoes a done
            run: its attempt moves to ``<run>/attempts/<n>/`` and a fresh one starts.
        hosts: ``None``: engines on this machine. Else a hosts file (its path, or
            :func:`workbench.launch.hosts.load_hosts`'s result, or a :class:`~workbench.launch.remote.Placement`):
            engines on those hosts, and every rank's result in the record names its host (``"placement"``).
        launcher: With ``hosts``: ipyparallel's ``"ssh"``, ``"mpi"`` or ``"slurm"`` launcher.
        pool: A sweep's :class:`~workbench.launch.pool.EnginePool`: a local run of a built-in model takes the held
            engines of its ranks and framework and leaves its own; a model factory's check is built once a sweep.

    Returns:
        A :class:`RunOutcome`; a failed run is recorded as failed (steps kept), not raised.

    Raises:
        ValueError: a bad argument (named), or a user's model or data refused, before anything starts.
        TimeoutError: a user's model factory took longer than ``timeout_s`` here, before anything started.
        RunLocked: another live process is running this spec on this store (named by pid).
    """
    check_run_knobs(spec, runs_root)
    limits = RunLimits(step_timeout_s, startup_timeout_s, timeout_s)
    deadline = time.monotonic() + timeout_s
    for name, fn in (("progress", progress), ("on_engines", on_engines)):
        if fn is not None and not callable(fn):
            raise ValueError(f"{name}={fn!r}: must be callable or None.")
    placement = Placement.of(hosts, launcher)  # a bad hosts file or launcher is refused before the record exists
    if pool is not None and not isinstance(pool, EnginePool):
        raise ValueError(f"pool={pool!r}: must be an EnginePool or None.")
    # a user's factory may change its process, so its runs start their own engines (as on other hosts)
    runner = pool.run if pool is not None and placement.hosts is None and spec.model_factory is None \
        else placement.runner(timeout_s=min(startup_timeout_s, timeout_s))
    store = RunStore(Path(runs_root))
    spec_dict = spec.to_dict()
    if skip_done and store.is_done(spec_dict):
        return RunOutcome(run_id_for(spec_dict), "skipped")
    from workbench.ranks.user_model import check_user_run
    from workbench.runs.estimate import estimate_run_memory

    # A user's factory (in a bounded subprocess) and data, checked here, before any engine starts.
    try:
        build = lambda s: build_user_model(s, max(0.1, deadline - time.monotonic()))  # noqa: E731
        user_model = check_user_run(spec, build=build if pool is None else lambda s: pool.user_model(s, build))
    except TimeoutError as err:
        raise TimeoutError(f"run_training(timeout_s={timeout_s:g}): {err}") from None
    meta = {} if user_model is None else {"model_shapes": [[p.path, list(p.shape), p.dtype] for p in user_model.params]}
    backend = "none" if spec.num_ranks == 1 and spec.framework == "mlx" else "ring" if spec.framework == "mlx" else "gloo"
    meta.update(backend=backend, memory_estimate=estimate_run_memory(spec, user_model).as_dict())
    handle = store.create(spec_dict, meta=meta, overwrite=not skip_done)
    try:
        return _run(_Attempt(spec, store, handle, limits, deadline, progress, on_engines, runner, placement.hosts is None))
    finally:
        handle.release()


def _run(attempt: _Attempt) -> RunOutcome:
    spec, store, handle, limits, deadline = attempt.spec, attempt.store, attempt.handle, attempt.limits, attempt.deadline
    t0 = time.monotonic()
    steps_path = handle.folder / "steps.jsonl"
    recovered = handle.recovered

    def describe(limit_s: float) -> str:  # what each rank was doing (the phases it reported)
        phases = read_phases(handle.folder, handle.record.get("attempt", 1))
        return describe_phases(phases, spec.num_ranks, spec.model_factory, limit_s)

    def train(engines: EngineRun) -> tuple[list, float]:
        if attempt.on_engines is not None:
            attempt.on_engines(engines)
        watchdog = StepWatchdog(steps_path, limits.step_timeout_s, limits.startup_timeout_s, attempt.progress,
                                spec.num_ranks, describe)
        paths = tuple(import_paths())  # the user's factory imports on the engines as here
        began = time.monotonic()
        try:
            with compile_folder(spec.framework, spec.num_ranks, attempt.local) as folder:
                args = (spec.to_dict(), str(store.root), handle.run_id, paths, folder)
                return (engines.apply(train_rank, [args] * spec.num_ranks, timeout_s=max(0.1, deadline - began),
                                      on_poll=watchdog, poll_s=0.1), engines.started_s)
        except EngineFailure as err:
            stuck = getattr(err, "stuck", None)
            if stuck is None:  # a rank failed, or the watchdog stopped the run and said why
                raise
            # The engines had what was left of the run's bound: name the bound the caller gave.
            told = f"ranks {stuck} did not finish within {limits.timeout_s:g} s (run_training's timeout_s, from the call)"
            if not (getattr(err, "phases_told", False) or _has_steps(steps_path)):  # say what the ranks were doing
                told = f"{told}: {describe(time.monotonic() - began)}"
            raise EngineFailure(told, None) from err

    try:
        results, ready_s = attempt.runner(spec.num_ranks, spec.framework, train,
                                          may_retry=lambda: not _has_steps(steps_path))
    except EngineFailure as err:
        handle.fail(str(err), err.rank)
        return RunOutcome(handle.run_id, "failed", str(err), err.rank, time.monotonic() - t0, recovered=recovered)
    except BaseException as err:  # interrupted: recorded, then re-raised
        handle.fail(f"{type(err).__name__}: {err}", None)
        raise
    handle.finish({"ranks": results, "engines_ready_s": ready_s})
    return RunOutcome(handle.run_id, "done", seconds=time.monotonic() - t0, engines_ready_s=ready_s, recovered=recovered)

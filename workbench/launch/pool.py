"""Engines kept from one run of a sweep to the next, on this machine: :class:`EnginePool`.

Every run used to start a controller and one engine per rank, and every rank imported its framework and joined
its peers, only to be stopped a few seconds later: in notebook 06's sweep (20 runs of 2 ranks) that was 2.2 s of
engines a run, and 1.4 s more to join ``jax.distributed``. A pool holds the last run's engines and hands them to
the next run of the same ranks and framework, which joins the group its engines already hold (MLX's ``init``
returns the group it made). Each run still starts from nothing of the last one's: :func:`~workbench.ranks.entry.train_rank`
drops the last run's buffers and resets the high-water mark before it builds anything.

JAX's engines are kept too, and their joined ``jax.distributed`` client with them. A JAX run's measured peak is
how far one more step after its own raises the process's high-water mark of resident memory (``VmHWM``), each
buffer in pages of its own (:func:`~workbench.ranks.profile_probe.step_rss_above`); on engines an earlier run used
it reads as on fresh ones. Read over the last timed step (before that measure), notebook 06's 9 JAX runs
(validation LM, 2 ranks, 2 steps) read 0.99-1.02 of XLA's plan under ddp
and fsdp-row on both, and fsdp-full 0.97-1.30 pooled, 1.03-1.31 fresh (gloo's buffers sit outside the plan), while
the sweep took 31.5 s pooled against 71.9 s fresh. One rank alone can read low on either: ZeRO-3's rank 0 read
0.60 of the plan once on reused engines, and 0.74-0.77 in suite runs on fresh ones; a run's peak is its highest
rank's, and test_validation holds that.

What is never reused: engines of a run that failed, timed out or was interrupted (they are stopped, as without a
pool: a rank may be wedged in a collective); engines of another rank count or framework, or started under another
environment or working folder of the driver (the engines inherited those); engines whose processes or registrations
are gone while they waited; engines on other hosts (a hosts file's placement starts its own each run); and a user
model factory's runs (the driver does not pass them: what a factory does to its process stays there; notebook 07's
peak check failed once, under load, on pooled factory runs, cause not found); of those it keeps the driver's check
of the factory's model instead (:meth:`EnginePool.user_model`), built once a sweep. The pool holds one set, so
idle engines never pile up.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Callable

import psutil

from workbench.launch.engines import EngineRun, start_engines
from workbench.launch.plan import plan_launch
from workbench.launch.relaunch import PORT_ATTEMPTS, relaunch, run_on_fresh_ports


#: The frameworks whose engines a pool keeps between runs.
KEPT_FRAMEWORKS = ("mlx", "jax")


class EnginePool:
    """One set of local engines, kept between runs (a context manager: every engine it holds is stopped on exit).

    ``pool.run`` has the signature of :func:`~workbench.launch.relaunch.run_on_fresh_ports`, the runner of a local
    :class:`~workbench.launch.remote.Placement`, so the driver takes either. ``starts`` counts the engine sets it
    started, ``reuses`` the runs that found their engines waiting.
    """

    def __init__(self) -> None:
        self._held: tuple[tuple, EngineRun] | None = None  # (key: what the engines were started for, engines)
        self.starts = self.reuses = 0
        self._models: dict[tuple, Any] = {}  # a user model's check, by what it depends on (user_model)

    def __enter__(self) -> "EnginePool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stop the engines held (idempotent)."""
        held, self._held = self._held, None
        if held is not None:
            held[1].stop()

    def run(self, num_ranks: int, framework: str, body: Callable[[EngineRun], Any], *,
            attempts: int = PORT_ATTEMPTS, may_retry: Callable[[], bool] = lambda: True) -> Any:
        """``body(engines)`` on the held engines of ``num_ranks`` ``framework`` ranks, else on fresh ones (a launch
        that failed at its start is relaunched, as :func:`run_on_fresh_ports` does); the engines are
        kept for the next run if ``body`` returns, stopped if it raises. The driver never hands it a run of a user's
        model factory (what a factory does to its process would stay there).

        Raises:
            EngineFailure: as :func:`run_on_fresh_ports`.
        """
        if framework not in KEPT_FRAMEWORKS:
            self.starts += 1
            return run_on_fresh_ports(num_ranks, framework, body, attempts=attempts, may_retry=may_retry)
        key = (num_ranks, framework, _driver_state())
        held, self._held = self._held, None
        if held is not None and held[0] == key and _alive(held[1]):
            engines = held[1]
            engines.started_s = 0.0  # this run waited for no engine
            self.reuses += 1
            return self._keep(key, engines, body)
        if held is not None:
            held[1].stop()

        def launch_and_run() -> Any:
            engines = start_engines(plan_launch(num_ranks, framework=framework))
            self.starts += 1
            return self._keep(key, engines, body)

        return relaunch(launch_and_run, attempts=attempts, may_retry=may_retry)

    def user_model(self, spec: Any, build: Callable[[Any], Any]) -> Any:
        """``build(spec)``, the driver's check of a user's model factory (its
        :class:`~workbench.core.specs.ModelSpec`, built in a subprocess of its own), once per factory, framework,
        seed, precision and model config in this pool's sweep, and from this working folder and import path:
        what the check depends on. A sweep over strategies, sizes or steps of one model builds it once, not once a
        run (notebook 07's sweep of 4 runs: 1 check, where there were 4). A factory's file edited during a sweep
        is not seen by the later runs' checks (their engines import it afresh, and build the edited model).
        A check that raised is not kept: the next run's check builds again and says why."""
        from workbench.runs.factory import import_paths

        key = (spec.model_factory, spec.framework, spec.init_seed, spec.precision,
               json.dumps(spec.model, sort_keys=True, default=str), tuple(import_paths()))
        if key not in self._models:
            self._models[key] = build(spec)
        return self._models[key]

    def _keep(self, key: tuple, engines: EngineRun, body: Callable[[EngineRun], Any]) -> Any:
        try:
            result = body(engines)
        except BaseException:
            engines.stop()  # a failed or interrupted run's engines are never handed on
            raise
        self.close()  # (nothing is held here, unless a run on another thread kept its own)
        self._held = (key, engines)
        return result


def _driver_state() -> str:
    """A digest of what engines inherit from the driver when they start: its environment and working folder."""
    return hashlib.sha256(repr((sorted(os.environ.items()), os.getcwd())).encode()).hexdigest()


def _alive(engines: EngineRun) -> bool:
    """Whether every engine still runs and is still registered with the controller (checked before a reuse: an
    engine can die, or miss its heartbeats, while it waits)."""
    if engines.cluster is None or engines.client is None:
        return False
    try:
        registered = set(engines.client.ids)
    except Exception:
        return False
    try:
        return set(engines.rank_engine.values()) <= registered and all(
            psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in engines.pids.values())
    except psutil.Error:  # gone (or never ours) between two looks
        return False

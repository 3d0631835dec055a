"""Engines kept from one run of a sweep to the next, on this machine: :class:`EnginePool`.

Every run used to start a controller and one engine per rank, and every rank imported its framework and joined
its peers, only to be stopped a few seconds later: in notebook 06's sweep (20 runs of 2 ranks) that was 2.2 s of
engines and 1.4 s of ``jax.distributed`` a run, about half of a JAX run's 9 s. A pool holds the last run's engines
and hands them to the next run of the same ranks and framework, which joins the group its engines already hold
(MLX's ``init`` returns the group it made; :func:`~workbench.ranks.train_jax.init_distributed` skips a
second ``initialize``). Each run still starts from nothing of the last one's: :func:`~workbench.ranks.entry.train_rank`
drops the last run's buffers and resets the high-water mark before it builds anything.

What is never reused: engines of a run that failed, timed out or was interrupted (they are stopped, as without a
pool: a rank may be wedged in a collective), engines of another rank count or framework (the pool holds one set,
so idle engines never pile up), and engines on other hosts (a hosts file's placement starts its own each run).
"""

from __future__ import annotations

from typing import Any, Callable

from workbench.launch.engines import PORT_ATTEMPTS, EngineFailure, EngineRun, is_port_clash, start_engines
from workbench.launch.plan import plan_launch


class EnginePool:
    """One set of local engines, kept between runs (a context manager: every engine it holds is stopped on exit).

    ``pool.run`` has the signature of :func:`~workbench.launch.engines.run_on_fresh_ports`, the runner of a local
    :class:`~workbench.launch.remote.Placement`, so the driver takes either. ``starts`` counts the engine sets it
    started, ``reuses`` the runs that found their engines waiting.
    """

    def __init__(self) -> None:
        self._held: tuple[tuple[int, str], EngineRun] | None = None
        self.starts = self.reuses = 0

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
        """``body(engines)`` on the held engines of ``num_ranks`` ``framework`` ranks, else on fresh ones (a port
        taken between the pick and the bind is relaunched, as :func:`run_on_fresh_ports` does); the engines are
        kept for the next run if ``body`` returns, stopped if it raises.

        Raises:
            EngineFailure: as :func:`run_on_fresh_ports`.
        """
        key = (num_ranks, framework)
        held, self._held = self._held, None
        if held is not None and held[0] == key and held[1].cluster is not None:
            engines = held[1]
            engines.started_s = 0.0  # this run waited for no engine
            self.reuses += 1
            return self._keep(key, engines, body)
        if held is not None:
            held[1].stop()
        for attempt in range(1, attempts + 1):
            try:
                engines = start_engines(plan_launch(num_ranks, framework=framework))
                self.starts += 1
                return self._keep(key, engines, body)
            except EngineFailure as err:
                if attempt == attempts or not is_port_clash(str(err)) or not may_retry():
                    raise

    def _keep(self, key: tuple[int, str], engines: EngineRun, body: Callable[[EngineRun], Any]) -> Any:
        try:
            result = body(engines)
        except BaseException:
            engines.stop()  # a failed or interrupted run's engines are never handed on
            raise
        self._held = (key, engines)
        return result

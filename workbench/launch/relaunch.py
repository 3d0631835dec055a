"""When a failed launch of engines is tried again: :func:`relaunch`, the rule of local engines, a pool's and a
hosts file's, and :func:`run_on_fresh_ports`, a launch of local engines under it."""

from __future__ import annotations

from typing import Any, Callable

from workbench.core.fingerprint import ANOTHER_LAUNCH
from workbench.launch.engines import EngineFailure, EngineRun, start_engines
from workbench.launch.plan import plan_launch


#: Launches tried when a rank cannot bind its rendezvous port (taken between the pick and the bind).
PORT_ATTEMPTS = 3
_PORT_CLASH = ("Failed to start RPC server", "Failed to add port to server",  # JAX coordinator (gRPC)
               "Couldn't bind socket (error: 98)",  # MLX ring: EADDRINUSE
               "Address already in use", "EADDRINUSE",
               ANOTHER_LAUNCH)  # two launches drew a port alike and their ranks crossed


def is_port_clash(message: str) -> bool:
    """Whether an engine failure is a rendezvous port taken by another process (JAX's coordinator,
    the MLX ring, NCCL) or shared with another launch's ranks, the one failure a relaunch on fresh ports cures."""
    return any(m in message for m in _PORT_CLASH)


def is_relaunchable(err: EngineFailure) -> bool:
    """Whether a launch that failed this way may be tried again on fresh engines and ports: a rendezvous port taken
    (:func:`is_port_clash`), or engines that registered but never answered their first task (once, in CI on 2 loaded
    cores, one JAX engine of a pool's fresh set; cause not found). Nothing of the run had started in either."""
    return is_port_clash(str(err)) or getattr(err, "unanswered", False)


def relaunch(launch_and_run: Callable[[], Any], *, attempts: int = PORT_ATTEMPTS,
             may_retry: Callable[[], bool] = lambda: True) -> Any:
    """``launch_and_run()``, again while it fails in a way a fresh launch may cure (:func:`is_relaunchable`), up
    to ``attempts`` launches, while ``may_retry()`` holds (a run with stored steps must not start again).

    Raises: EngineFailure: any other failure, or the last launch's."""
    for attempt in range(1, attempts + 1):
        try:
            return launch_and_run()
        except EngineFailure as err:
            if attempt == attempts or not is_relaunchable(err) or not may_retry():
                raise


def run_on_fresh_ports(num_ranks: int, framework: str, body: Callable[[EngineRun], Any], *,
                       attempts: int = PORT_ATTEMPTS, may_retry: Callable[[], bool] = lambda: True) -> Any:
    """Plan a launch (:func:`~workbench.launch.plan.plan_launch`), start its engines, return ``body(engines)``;
    the engines are stopped after it, and a launch that failed at its start is tried again (:func:`relaunch`)."""

    def launch_and_run() -> Any:
        with start_engines(plan_launch(num_ranks, framework=framework)) as engines:
            return body(engines)

    return relaunch(launch_and_run, attempts=attempts, may_retry=may_retry)

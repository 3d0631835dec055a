"""Running a launch plan on ipyparallel engines, one engine per rank.

:func:`start_engines` turns a :class:`~workbench.launch.plan.LaunchPlan` into an
``ipyparallel.Cluster`` whose engine ``r`` carries rank ``r``'s environment (the MLX
ring hostfile, the JAX coordinator), bound to loopback by default. :class:`EngineRun` is a
context manager: the engines are stopped when the run ends, fails, or the cell is
interrupted, so no engine outlives it; if the driver itself is killed, a reaper process
(:mod:`workbench.launch.reaper`) kills them and the controller. Engines return plain data, never live arrays.

For more than one machine, pass ipyparallel's own launchers through
``engine_launcher_class`` (``"mpi"``, ``"ssh"``, ``"slurm"``) and their settings through
``cluster_kwargs``; only ``"local"`` is tested here.
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from workbench.launch.cluster_files import CLUSTER_PREFIX, cluster_profile_dir, remove_stale_cluster_files
from workbench.launch.plan import LaunchPlan
from workbench.launch.reaper import Reaper, start_reaper

#: The controller's heartbeat: it completes a registration only on a beat after the engine connects (2 engines
#: answered 5.9 s after launch at ipyparallel's 3 s period, 2.2 s at 0.5 s, 1.4-1.6 s at 0.1 s). Over 55 missed
#: beats (5.6 s) declare an engine dead (``max_heartmonitor_misses``; ``max_heartbeat_misses`` is the engine's).
FAST_HEARTBEAT = ("--HeartMonitor.period=100", "--HeartMonitor.max_heartmonitor_misses=55")
#: Longest wait, in seconds, for a dead engine's process to end before its error is written (it has
#: normally ended already: ipyparallel's nanny reports the death after the exit).
DEATH_WAIT_S = 10.0
#: Time, in seconds, registered engines are given to answer their first task at a start (they answer in ~0.1 s).
ANSWER_S = 20.0


class EngineFailure(RuntimeError):
    """An engine died or raised; ``rank`` names it (``None`` when the run timed out)."""

    def __init__(self, message: str, rank: int | None):
        super().__init__(message)
        self.rank = rank


@dataclass
class EngineRun:
    """Engines of one launch plan: ``rank_engine[r]`` is the ipyparallel engine id of rank r."""

    plan: LaunchPlan
    cluster: Any
    client: Any
    rank_engine: dict[int, int]
    pids: dict[int, int]  # engines on this machine only (remote ones are stopped through ipyparallel)
    workdir: Path
    _tmp: Any = field(default=None, repr=False)
    started_s: float = 0.0
    launchers: dict[int, Any] = field(default_factory=dict, repr=False)  # rank -> ipyparallel engine set launcher
    #: rank -> that set's engine launchers, kept here: ipyparallel's loop (a notebook's) drops a stopped one from its set
    engine_launchers: dict[int, list] = field(default_factory=dict, repr=False)
    reaper: Reaper | None = field(default=None, repr=False)  # kills all of it if the driver dies

    def output_tail(self, rank: int) -> str:
        """The last lines rank ``rank``'s engine wrote (its log, without ipyparallel's chatter): why an
        engine that died without raising died (an abort in native code, a clash on a port)."""
        from workbench.launch.outstream import last_words, read_output

        launchers = self.engine_launchers.get(rank) or list(getattr(self.launchers.get(rank), "launchers", {}).values())
        return last_words("".join(read_output(sub) for sub in launchers))

    def death_report(self, rank: int, wait_s: float = DEATH_WAIT_S) -> str:
        """How rank ``rank``'s engine ended (exit code or signal) and the last lines it wrote, read once its process
        has ended (up to ``wait_s``: all it wrote is in its log by then); one still running then is said to be so."""
        from workbench.launch.outstream import describe_exit, exit_status, is_local_engine

        local = [exit_status(sub, wait_s) for sub in self.engine_launchers.get(rank, []) if is_local_engine(sub)]
        if not local:
            how = "exit status unknown: not started on this machine"
        elif all(ended for ended, _ in local):
            how = ", ".join(describe_exit(code) for _, code in local)
        else:
            how = f"the controller lost it (missed heartbeats?), though its process still ran {wait_s:g} s later"
        return f"the engine of rank {rank} died ({how}); its output ended:\n{self.output_tail(rank)}"

    def __enter__(self) -> "EngineRun":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def apply(self, fn: Callable, rank_args: list[tuple], *, timeout_s: float, poll_s: float = 0.05,
              on_poll: Callable[[], None] | None = None) -> list[Any]:
        """Run ``fn(*rank_args[r])`` on every rank's engine at once and return the results in rank order.

        ``on_poll`` is called while waiting (progress display, watchdogs); if it raises, the engines are stopped and
        the exception propagates.

        Raises:
            EngineFailure: an engine died, before or after its task was sent (:meth:`death_report`: the rank, its
                exit code or signal, its last lines), or raised (the rank), or ``timeout_s`` passed; all stopped first.
        """
        from ipyparallel.error import NoEnginesRegistered  # raised, like IndexError, for an engine the client lost

        if len(rank_args) != self.plan.num_ranks:
            raise ValueError(f"rank_args has {len(rank_args)} entries for {self.plan.num_ranks} ranks.")
        deadline, pending = time.monotonic() + timeout_s, {}
        try:
            for r in range(self.plan.num_ranks):  # an engine that died since the start is gone from the client
                try:
                    pending[r] = self.client[self.rank_engine[r]].apply_async(fn, *rank_args[r])
                except (IndexError, NoEnginesRegistered) as err:  # any other error is the task's, raised as it is
                    raise EngineFailure(f"rank {r} failed (EngineError): {self.death_report(r)}", r) from err
            while True:
                failed = {}
                for r, ar in pending.items():
                    if ar.ready() and not ar.successful():
                        try:
                            ar.get(0)
                        except Exception as err:  # RemoteError, EngineError
                            failed[r] = err
                if failed:
                    # When one rank dies its peers soon fail in their collectives: blame a dead
                    # engine first (EngineError), then the lowest rank, and name every failed rank.
                    r = min(failed, key=lambda k: (getattr(failed[k], "ename", "") != "EngineError", k))
                    kind = getattr(failed[r], "ename", type(failed[r]).__name__)
                    others = f" (also failed: ranks {sorted(set(failed) - {r})})" if len(failed) > 1 else ""
                    # ipyparallel's "Engine 0 died" names its engine id, not the rank: say it in ranks
                    why = self.death_report(r) if kind == "EngineError" else str(failed[r])[-2000:]
                    raise EngineFailure(f"rank {r} failed ({kind}){others}: {why}", r) from failed[r]
                if all(ar.ready() for ar in pending.values()):
                    return [pending[r].get(0) for r in range(self.plan.num_ranks)]
                if time.monotonic() > deadline:
                    stuck = [r for r, ar in pending.items() if not ar.ready()]
                    timed_out = EngineFailure(f"ranks {stuck} did not finish within {timeout_s:g} s", None)
                    timed_out.stuck = stuck
                    raise timed_out
                if on_poll is not None:
                    on_poll()
                time.sleep(poll_s)
        except BaseException:
            self.stop()  # a failure, a timeout, or KeyboardInterrupt: no engine outlives the run
            raise

    def stop(self) -> None:
        """Stop every engine and the controller (idempotent), then make sure their processes are gone."""
        if self.cluster is None:
            return
        cluster, self.cluster = self.cluster, None
        # Engines first, outright: one may be wedged in a collective (MLX #4475) or a long task, and ipyparallel's
        # graceful stop waits for the task. Engines hold nothing to save: runs store their steps as they go. Those
        # started here are killed too where they never said their pid (a start that failed).
        from workbench.launch.outstream import is_local_engine, keep_output_decodable

        started = [sub.pid for subs in self.engine_launchers.values() for sub in subs
                   if is_local_engine(sub) and isinstance(getattr(sub, "pid", None), int) and sub.pid > 0]
        for pid in {*self.pids.values(), *started}:
            try:
                os.kill(pid, 9)
            except (ProcessLookupError, PermissionError):
                pass

        for launchers in self.engine_launchers.values():
            for sub in launchers:
                keep_output_decodable(sub)
        try:
            if self.client is not None:
                self.client.close()
        except Exception:
            pass
        group = controller_group(cluster)  # before the stop: afterwards its first process may be gone
        try:
            cluster.stop_cluster_sync()
        except Exception:
            pass
        kill_controller_group(group)
        # the controller's engine-state file is the one file of the run that ipyparallel's stop leaves behind
        Path(cluster.profile_dir, "log", f"engines{cluster.cluster_id}.json").unlink(missing_ok=True)
        if self._tmp is not None:
            self._tmp.cleanup()
        if self.reaper is not None:
            self.reaper.release()


def controller_group(cluster) -> int | None:
    """The process group of ``cluster``'s controller, where it is not this process's own; else None."""
    pid = getattr(getattr(cluster, "controller", None), "pid", None)
    try:
        group = os.getpgid(pid) if pid else None
    except OSError:
        return None
    return None if group == os.getpgrp() else group


def kill_controller_group(group: int | None) -> None:
    """SIGKILL the controller processes still in ``group`` after its stop: a stop that fails or times out (once,
    at load 15 on 2 cores, both processes of a controller were left running for half an hour)."""
    if group is None:
        return
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        try:
            if os.getpgid(proc.pid) == group and "ipyparallel.controller" in " ".join(proc.info["cmdline"] or ()):
                proc.kill()
        except (psutil.Error, OSError):
            pass


def start_engines(plan: LaunchPlan, *, timeout_s: float = 60.0, engine_launcher_class: str = "local",
                  workdir: Path | None = None, **cluster_kwargs: Any) -> EngineRun:
    """Start one ipyparallel engine per rank of ``plan`` with that rank's environment.

    Args:
        plan: From :func:`workbench.launch.plan.plan_launch` (MLX ring hostfile and JAX coordinator
            on ``plan.host``, loopback by default).
        timeout_s: How long to wait for every engine to register.
        engine_launcher_class: ipyparallel's engine launcher (``"local"``; ``"mpi"``, ``"ssh"``,
            ``"slurm"`` for larger setups, configured through ``cluster_kwargs``).
        workdir: Where the ring hostfile goes (default: a temporary folder removed on stop).

    Raises:
        EngineFailure: if the engines do not all register within ``timeout_s`` (everything
            started so far is stopped).
    """
    import ipyparallel as ipp
    from traitlets.config import Config

    from workbench.launch.outstream import ENGINE_ARG

    t0 = time.monotonic()
    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="workbench-engines-")
        workdir = Path(tmp.name)
    workdir.mkdir(parents=True, exist_ok=True)
    extra_env = plan.write_files(workdir)
    cluster_kwargs.setdefault("controller_args", list(FAST_HEARTBEAT))
    config = cluster_kwargs.setdefault("config", Config())  # native output straight to the engine's log
    config.EngineLauncher.engine_args = [*config.EngineLauncher.get("engine_args", []), ENGINE_ARG]
    cluster_kwargs.setdefault("cluster_id", f"{CLUSTER_PREFIX}{os.getpid()}-{os.urandom(4).hex()}")
    cluster_kwargs.setdefault("profile_dir", str(cluster_profile_dir()))
    cluster = ipp.Cluster(n=0, controller_ip=plan.host, log_level=logging.ERROR,
                          engine_launcher_class=engine_launcher_class, **cluster_kwargs)
    remove_stale_cluster_files(Path(cluster.cluster_file).parent)
    run = EngineRun(plan, cluster, None, {}, {}, workdir, tmp, reaper=start_reaper())
    try:
        run.reaper.remove_on_death(cluster.cluster_file)
        cluster.start_controller_sync()
        run.reaper.watch(cluster.controller.pid)
        for r in range(plan.num_ranks):
            before = set(cluster.engines)
            cluster.start_engines_sync(n=1, environment={**extra_env, **plan.rank_env[r], "WORKBENCH_RANK": str(r)})
            run.launchers.update({r: cluster.engines[key] for key in set(cluster.engines) - before})
            run.engine_launchers[r] = list(run.launchers[r].launchers.values())
            for sub in run.engine_launchers[r]:
                if isinstance(getattr(sub, "pid", None), int) and sub.pid > 0 and engine_launcher_class == "local":
                    run.reaper.watch(sub.pid)
        run.client = cluster.connect_client_sync()
        # interactive=False: in a notebook ipyparallel would otherwise draw its own unlabelled "2/2 engines"
        # progress bar under each run (issue 18); the run's own progress says what is happening.
        run.client.wait_for_engines(plan.num_ranks, timeout=timeout_s, interactive=False)
        # bounded: an engine that registers but never answers (within ANSWER_S of the last registration) fails the
        # start, and its launch is tried again (relaunch)
        deadline = time.monotonic() + ANSWER_S
        asks = {eid: run.client[eid].apply_async(rank_identity) for eid in run.client.ids}
        for eid, ask in asks.items():
            try:
                rank, host, pid = ask.get(timeout=max(1.0, deadline - time.monotonic()))
            except TimeoutError:
                continue
            run.rank_engine[rank] = eid
            if host == socket.gethostname():  # only engines on this machine can be killed from here
                run.pids[rank] = pid
        if len(run.rank_engine) < plan.num_ranks:
            raise _unanswered(run, sorted(set(asks) - set(run.rank_engine.values())), time.monotonic() - t0)
    except BaseException as err:
        run.stop()
        if isinstance(err, (KeyboardInterrupt, SystemExit, EngineFailure)):
            raise
        raise EngineFailure(f"engines did not start: {err}", None) from err
    run.started_s = time.monotonic() - t0
    return run


def _unanswered(run: EngineRun, engine_ids: list[int], waited_s: float) -> EngineFailure:
    """The start failure of engines that registered but did not answer: which, and what each silent rank wrote
    (a launch failed so is tried again: :func:`~workbench.launch.relaunch.is_relaunchable`)."""
    silent = [r for r in range(run.plan.num_ranks) if r not in run.rank_engine]
    said = "; ".join(f"rank {r} wrote: {run.output_tail(r).strip()[-300:] or '(nothing)'}" for r in silent)
    err = EngineFailure(f"engines did not start: engines {engine_ids} registered but did not answer within "
                        f"{waited_s:.0f} s ({said})", None)
    err.unanswered = True
    return err


def rank_identity() -> tuple[int, str, int]:
    """Run on an engine: its rank, hostname and pid (what every launcher checks its engines by)."""
    import os
    import socket

    return int(os.environ["WORKBENCH_RANK"]), socket.gethostname(), os.getpid()

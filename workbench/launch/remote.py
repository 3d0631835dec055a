"""Engines on several hosts, started by ipyparallel's own launchers (ssh, ``mpiexec``, Slurm).

:func:`start_remote_engines` starts an ``ipyparallel.Cluster`` whose controller listens only on the
address the hosts reach this machine by (never ``0.0.0.0``) and signs every message with its
connection key, which the engines receive in their environment (``IPP_CONNECTION_INFO``), never on a
command line or through a file copy. Engines run :mod:`workbench.launch.engine_env`, which gives each
its rank's environment and then becomes ``ipyparallel.engine``:

* ``"ssh"``: ipyparallel's ``SSHEngineSetLauncher``, one engine set per rank (its environment);
* ``"mpi"``: ipyparallel's ``MPIEngineSetLauncher``: one ``mpiexec`` (OpenMPI) over a hostfile of
  the hosts' addresses and slots, its daemons started through ssh;
* ``"slurm"``: ipyparallel's ``SlurmEngineSetLauncher``: one ``sbatch`` job whose ``srun`` starts the ranks.

:class:`RemoteEngineRun` is an :class:`~workbench.launch.engines.EngineRun` that knows each rank's
host: failures name the rank and its host, and stopping reaches every host, bounded in time, even
when one of them has dropped off the network.
"""

from __future__ import annotations

import logging
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from workbench.launch.cluster_files import cluster_profile_dir
from workbench.launch.engines import (
    FAST_HEARTBEAT,
    EngineFailure,
    EngineRun,
    rank_identity,
)
from workbench.launch.host_values import check_controller_ip, check_ssh_config_file
from workbench.launch.hosts import HostsFile, MultiHostPlan, as_hosts, plan_hosts_launch
from workbench.launch.relaunch import PORT_ATTEMPTS, relaunch, run_on_fresh_ports
from workbench.launch.remote_cmd import (  # noqa: F401  (slurm_template: imported from here before it moved)
    check_reachable,
    check_slurm_nodes,
    engine_starts,
    rsh_args,
    slurm_template,
    ssh_options,
    toward,
)

LAUNCHERS = ("ssh", "mpi", "slurm")


@dataclass
class RemoteEngineRun(EngineRun):
    """Engines across hosts: ``rank_hosts[r]`` is ``{"host", "address", "hostname", "pid"}`` of rank r."""

    rank_hosts: dict[int, dict] = field(default_factory=dict)
    launcher: str = "ssh"
    controller_ip: str = ""

    def where(self, rank: int | None) -> str:
        if rank is None or rank not in self.rank_hosts:
            return ""
        h = self.rank_hosts[rank]
        return f"host {h['host']} ({h['hostname']})" if h.get("hostname") else f"host {h['host']}"

    def apply(self, fn: Callable, rank_args: list[tuple], **kwargs: Any) -> list[Any]:
        """:meth:`EngineRun.apply`, with the failed rank's host in the error; a rank's result that is a
        dict gains ``"placement"`` (its host's name and address, the engine's hostname and pid), so a run
        record names every rank's host."""
        try:
            results = super().apply(fn, rank_args, **kwargs)
            return [{**res, "placement": self.rank_hosts.get(r)} if isinstance(res, dict) else res
                    for r, res in enumerate(results)]
        except EngineFailure as err:
            if err.rank is None:
                raise
            raise EngineFailure(str(err).replace(f"rank {err.rank} ", f"rank {err.rank} on {self.where(err.rank)} ", 1),
                                err.rank) from err

    def record(self) -> list[dict]:
        """Where each rank ran, in rank order (for the run record)."""
        return [{"rank": r, **self.rank_hosts[r]} for r in sorted(self.rank_hosts)]

    def stop(self) -> None:
        """Kill every engine through its launcher, all hosts at once (a host off the network costs
        ssh's connect timeout, not a hang), then stop the controller."""
        cluster = self.cluster
        if cluster is None:
            return
        launchers = list(cluster.engines.values())
        if launchers:
            with ThreadPoolExecutor(len(launchers)) as pool:
                for fut in [pool.submit(_kill_set, es) for es in launchers]:
                    try:
                        fut.result(timeout=30)
                    except Exception:  # noqa: BLE001 - a host we cannot reach; its engines stop themselves
                        pass
            cluster.engines.clear()
        super().stop()


def _kill_set(engine_set) -> None:
    subs = getattr(engine_set, "launchers", None) or {"": engine_set}
    for sub in subs.values():
        try:
            sub.signal(9)
        except Exception:  # noqa: BLE001
            pass
    for sub in subs.values():  # ssh launchers watch their engine from a thread: let it see the engine gone
        stop, thread = getattr(sub, "_stop_waiting", None), getattr(sub, "_wait_thread", None)
        if stop is not None and thread is not None:
            stop.set()
            thread.join(timeout=10)


def controller_address(hosts: HostsFile, controller_ip: str | None = None) -> str:
    """The controller's address: given, from the hosts file, or the one this machine reaches host 0 by;
    normalised, and never a wildcard or loopback spelling (:func:`~workbench.launch.host_values.check_controller_ip`).

    Raises:
        ValueError: naming ``controller_ip``.
    """
    ip = controller_ip or hosts.controller_ip or toward(hosts.hosts[0].address, hosts.hosts[0].port)
    return check_controller_ip(ip)


def start_remote_engines(plan: MultiHostPlan, *, launcher: str = "ssh", controller_ip: str | None = None,
                         ssh_config: str | None = None, timeout_s: float = 60.0, connect_timeout_s: float = 5.0,
                         workdir: Path | None = None, slurm: dict | None = None) -> RemoteEngineRun:
    """Start one engine per rank of ``plan`` on its host, through ipyparallel's ``launcher``.

    Args:
        plan: From :func:`workbench.launch.hosts.plan_hosts_launch`.
        launcher: ``"ssh"``, ``"mpi"`` or ``"slurm"``.
        controller_ip: Address the controller listens on (default: see :func:`controller_address`).
        ssh_config: An ssh config file (``ssh -F``), e.g. the rig's.
        timeout_s: Bound on the whole start: every engine registered and answering.
        connect_timeout_s: ssh's connect timeout; a host that does not answer within it is named.
        slurm: Extra settings of ipyparallel's ``SlurmEngineSetLauncher`` (``queue``, ``account``, ...).

    Raises:
        ValueError: an unknown launcher, a value that cannot go on its command line or script (named).
        EngineFailure: a host unreachable (named; for Slurm: its node down or unknown to the cluster), a host
            whose ``python`` failed a command of the launcher (named, with that python), or the engines did not
            all register within ``timeout_s`` (naming the hosts whose engines did not answer); everything started
            so far is stopped.
    """
    import ipyparallel as ipp

    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher={launcher!r}: choose one of {', '.join(LAUNCHERS)}")
    t0 = time.monotonic()
    hosts = plan.used_hosts
    ip = controller_address(HostsFile(hosts=plan.hosts), controller_ip)
    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="workbench-remote-")
        workdir = Path(tmp.name)
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        if ssh_config:
            check_ssh_config_file(ssh_config)
        ssh_args = ssh_options(ssh_config, connect_timeout_s)
        starts = engine_starts(plan, launcher, ip, workdir, ssh_args, slurm)  # built and checked: nothing started yet
        if launcher == "slurm":
            nodes = (slurm or {}).get("nodes") or [h.name for h in hosts]
            check_slurm_nodes(nodes, hosts, timeout_s=max(10.0, connect_timeout_s))
        else:
            check_reachable(hosts, timeout_s=connect_timeout_s)
    except BaseException:
        if tmp is not None:
            tmp.cleanup()
        raise
    cluster = ipp.Cluster(n=0, controller_ip=ip, log_level=logging.ERROR, engine_launcher_class=launcher,
                          controller_args=list(FAST_HEARTBEAT), cluster_id=f"workbench-remote-{time.time_ns():x}",
                          profile_dir=str(cluster_profile_dir()))  # ~/.cache/... on the hosts too
    run = RemoteEngineRun(plan, cluster, None, {}, {}, workdir, tmp, launcher=launcher, controller_ip=ip)
    try:
        cluster.start_controller_sync()
        for start in starts:
            cluster.start_engines_sync(**start)
        run.launchers.update(dict(enumerate(cluster.engines.values())))
        run.client = cluster.connect_client_sync()
        _identify(run, t0 + timeout_s)
    except BaseException as err:
        run.stop()
        if isinstance(err, (KeyboardInterrupt, SystemExit)):
            raise
        missing = sorted({plan.host_of(r).name for r in range(plan.num_ranks) if r not in run.rank_hosts})
        which = _failed_python(err, hosts) or (f" (no engine answered from {', '.join(missing)})"
                                               if missing and run.client is not None else "")
        raise EngineFailure(f"engines did not start on the hosts via {launcher}{which}: {_short(err)}", None) from err
    run.started_s = time.monotonic() - t0
    return run


def _identify(run: RemoteEngineRun, deadline: float) -> None:
    """Wait for every engine and learn which rank, host and pid each is (bounded by ``deadline``). Where some never
    register, those that did are still identified (a second each at most), so that the failure names only the
    hosts whose engines are missing, not every host."""
    n = run.plan.num_ranks
    while len(run.client.ids) < n and time.monotonic() <= deadline:
        time.sleep(0.05)
    registered = list(run.client.ids)
    asks = {eid: run.client[eid].apply_async(rank_identity) for eid in registered}
    for eid, ask in asks.items():
        rank, hostname, pid = ask.get(timeout=max(1.0, deadline - time.monotonic()))
        run.rank_engine[rank] = eid
        h = run.plan.host_of(rank)
        run.rank_hosts[rank] = {"host": h.name, "address": h.address, "hostname": hostname, "pid": pid}
    if len(registered) < n:
        raise TimeoutError(f"{len(registered)} of {n} engines registered in time")


def _failed_python(err: BaseException, hosts) -> str:
    """Where ``err`` is a failed command of ipyparallel's launcher sent to one of ``hosts`` (ssh to its address),
    the words naming that host and its ``python``; else ''."""
    cmd = getattr(err, "cmd", None)
    if not isinstance(err, subprocess.CalledProcessError) or not isinstance(cmd, (list, tuple)):
        return ""
    failed = next((h for h in hosts if h.address in cmd), None)
    return "" if failed is None else (
        f" (host {failed.name} ({failed.address}:{failed.port}): a command of its python {failed.python!r} exited "
        f"{err.returncode}; is it a Python with ipyparallel and workbench installed on that host?)")


def _short(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}"
    out = getattr(err, "output", None)
    if isinstance(out, bytes):
        text += " " + out.decode(errors="replace").strip()[-600:]
    return text


def run_on_hosts(hosts, num_ranks: int, framework: str, body: Callable[[RemoteEngineRun], Any], *,
                 launcher: str = "ssh", slots: int | None = None, attempts: int = PORT_ATTEMPTS,
                 may_retry: Callable[[], bool] = lambda: True, **start_kwargs: Any) -> Any:
    """:func:`~workbench.launch.relaunch.run_on_fresh_ports` across ``hosts`` (a hosts file, its path, or
    :class:`~workbench.launch.hosts.Host` s): plan, start through ``launcher``, return ``body(engines)``."""
    hf = as_hosts(hosts, slots=slots)
    start_kwargs.setdefault("ssh_config", hf.ssh_config)
    start_kwargs.setdefault("controller_ip", hf.controller_ip)

    def launch_and_run() -> Any:
        with start_remote_engines(plan_hosts_launch(hf, num_ranks, framework=framework), launcher=launcher,
                                  **start_kwargs) as engines:
            return body(engines)

    return relaunch(launch_and_run, attempts=attempts, may_retry=may_retry)


@dataclass(frozen=True)
class Placement:
    """Where a run's engines start: on this machine (``hosts`` None), or on a hosts file's hosts through one of
    ipyparallel's launchers. Made once, where a caller names its hosts (:meth:`of`), and handed on whole.

    Attributes:
        hosts: The loaded hosts file, or None.
        launcher: ``"ssh"``, ``"mpi"`` or ``"slurm"`` (with hosts).
    """

    hosts: HostsFile | None = None
    launcher: str = "ssh"

    @classmethod
    def of(cls, hosts: Any = None, launcher: str = "ssh") -> "Placement":
        """The placement of ``hosts`` (a hosts file, its path, :class:`~workbench.launch.hosts.Host` s, or a
        Placement, returned as it is) through ``launcher``.

        Raises:
            ValueError: an unknown launcher, or hosts that do not load (named), before anything starts.
        """
        if isinstance(hosts, Placement):
            return hosts
        if hosts is None:
            return cls(None, launcher)
        if launcher not in LAUNCHERS:
            raise ValueError(f"launcher={launcher!r}: choose one of {', '.join(LAUNCHERS)}")
        hf = as_hosts(hosts)
        if launcher == "mpi":  # OpenMPI splits ssh's arguments on whitespace: refused now, before a run is recorded
            try:
                rsh_args(ssh_options(hf.ssh_config, 1))
            except ValueError as err:
                raise ValueError(f"hosts file {hf.source}: {err}" if hf.source else str(err)) from None
        return cls(hf, launcher)

    def runner(self, **start_kwargs: Any) -> Callable[..., Any]:
        """``run(num_ranks, framework, body, *, may_retry)``: on local engines
        (:func:`~workbench.launch.relaunch.run_on_fresh_ports`), or across the hosts (:func:`run_on_hosts`, which
        passes ``start_kwargs`` to :func:`start_remote_engines`: ``timeout_s``, its bound on the engines' start)."""
        if self.hosts is None:
            return run_on_fresh_ports

        def run(num_ranks: int, framework: str, body: Callable[[RemoteEngineRun], Any], **kwargs: Any) -> Any:
            return run_on_hosts(self.hosts, num_ranks, framework, body, launcher=self.launcher, **start_kwargs,
                                **kwargs)

        return run

    def record(self) -> dict | None:
        """What a benchmark's spec says of it: the launcher and each host's address and slots (None: here)."""
        if self.hosts is None:
            return None
        return {"launcher": self.launcher, "hosts": [[h["address"], h["slots"]] for h in describe_hosts(self.hosts)]}


def describe_hosts(hosts, slots: int | None = None) -> list[dict]:
    """The hosts as plain data (for a run's record)."""
    return [{"name": h.name, "address": h.address, "slots": h.slots, "port": h.port, "user": h.user,
             "python": h.python} for h in as_hosts(hosts, slots=slots).hosts]


__all__ = ["LAUNCHERS", "Placement", "RemoteEngineRun", "controller_address", "describe_hosts", "rank_identity", "run_on_hosts",
           "start_remote_engines"]

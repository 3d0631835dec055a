"""What the remote launchers are told: ssh options, the engines' shared environment, OpenMPI's
arguments and hostfile, and a reachability check that names the host that does not answer.
"""

from __future__ import annotations

import json
import os
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from workbench.launch.engines import EngineFailure
from workbench.launch.hosts import Host, MultiHostPlan
from workbench.launch.plan import OMPI_THREAD_MULTIPLE

#: The module engines run on the hosts (it becomes ``ipyparallel.engine``).
ENGINE_MODULE = "workbench.launch.engine_env"


def ssh_options(ssh_config: str | None, connect_timeout_s: float) -> list[str]:
    """ssh's arguments: never a prompt (a launcher has no terminal), bounded connects, dead links noticed."""
    args = ["-F", ssh_config] if ssh_config else []
    return args + ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, round(connect_timeout_s))}",
                   "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"]


def engine_env(plan: MultiHostPlan, grace_s: float = 10.0) -> dict[str, str]:
    """The environment every engine of ``plan`` gets; :mod:`workbench.launch.engine_env` picks its rank's part."""
    envs = [dict(e) for e in plan.rank_env]
    env = {"WORKBENCH_RANK_ENVS": json.dumps(envs), "WORKBENCH_CONTROLLER_GRACE_S": f"{grace_s:g}"}
    if plan.hostfile is not None:
        env["WORKBENCH_MLX_HOSTFILE_JSON"] = json.dumps(plan.hostfile)
    return env


def openmpi_hostfile(plan: MultiHostPlan) -> str:
    """OpenMPI's hostfile: each host that carries ranks, with as many slots as it carries."""
    counts = {}
    for r in range(plan.num_ranks):
        h = plan.host_of(r)
        counts[h.address] = counts.get(h.address, 0) + 1
    return "".join(f"{address} slots={n}\n" for address, n in counts.items())


def mpi_args(plan: MultiHostPlan, controller_ip: str, workdir: Path, ssh_args: list[str]) -> list[str]:
    """``mpiexec`` arguments (OpenMPI) placing rank r on ``plan.host_of(r)``: the hostfile, slot order,
    its daemons started by ssh (one hop each), and its own traffic on the hosts' addresses only."""
    path = Path(workdir) / "openmpi-hostfile"
    path.write_text(openmpi_hostfile(plan))
    nets = ",".join(f"{a}/32" for a in [controller_ip, *(h.address for h in plan.used_hosts)])
    users = {h.user for h in plan.used_hosts} - {None}
    ports = {h.port for h in plan.used_hosts}
    rsh = list(ssh_args) + (["-l", users.pop()] if len(users) == 1 else []) + (["-p", str(ports.pop())] if len(ports) == 1 else [])
    args = ["--hostfile", str(path), "--map-by", "slot", "--mca", "plm_rsh_agent", "ssh",
            "--mca", "plm_rsh_args", " ".join(rsh), "--mca", "plm_rsh_no_tree_spawn", "1",
            "--mca", "oob_tcp_if_include", nets, "--mca", "btl_tcp_if_include", nets,
            "--mca", "orte_keep_fqdn_hostnames", "1"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        args.append("--allow-run-as-root")
    for name in ("WORKBENCH_RANK_ENVS", "WORKBENCH_MLX_HOSTFILE_JSON", "WORKBENCH_CONTROLLER_GRACE_S",
                 "IPP_CONNECTION_INFO", "IPP_CLUSTER_ID", "IPP_PROFILE_DIR"):
        args += ["-x", name]  # OpenMPI passes no variable to other hosts unless asked
    # MPI_THREAD_MULTIPLE: MLX calls MPI from one thread per stream (see launch.plan.mpirun_command).
    args += ["-x", f"OMPI_MPI_THREAD_LEVEL={OMPI_THREAD_MULTIPLE}"]
    return args


def toward(address: str, port: int = 22) -> str:
    """This machine's address on the route to ``address`` (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((address, port))
        return s.getsockname()[0]


def check_reachable(hosts: tuple[Host, ...], timeout_s: float) -> None:
    """Connect to every host's sshd at once; raise naming each host that does not answer within ``timeout_s``."""
    def probe(h: Host) -> str | None:
        try:
            socket.create_connection((h.address, h.port), timeout=timeout_s).close()
            return None
        except OSError as err:
            why = "timed out" if isinstance(err, TimeoutError) else (err.strerror or str(err))
            return f"host {h.name} ({h.address}:{h.port}) unreachable: {why} after {timeout_s:g} s"

    with ThreadPoolExecutor(len(hosts)) as pool:
        problems = [p for p in pool.map(probe, hosts) if p]
    if problems:
        raise EngineFailure("; ".join(problems), None)


__all__ = ["ENGINE_MODULE", "check_reachable", "engine_env", "mpi_args", "openmpi_hostfile", "ssh_options", "toward"]

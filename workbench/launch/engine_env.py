"""The engine command on a remote host: give the engine its rank's environment, then become the engine.

ipyparallel's launchers (ssh, ``mpiexec``, Slurm) start ``python -m workbench.launch.engine_env ARGS``
where they would start ``python -m ipyparallel.engine ARGS``. This module

1. finds its rank: ``WORKBENCH_RANK`` (the ssh launcher sets it per engine), else the rank the launcher
   gave the process (``OMPI_COMM_WORLD_RANK``, ``PMI_RANK``, ``SLURM_PROCID``): one ``mpiexec`` or
   ``srun`` starts every rank with one environment, so the per-rank part travels as JSON in
   ``WORKBENCH_RANK_ENVS`` and is applied here;
2. writes the MLX ring hostfile from ``WORKBENCH_MLX_HOSTFILE_JSON`` where this host can read it (no
   shared filesystem needed): an anonymous in-memory file that dies with the engine, on Linux;
3. forks a dead man's switch: a process that kills the engine when the controller has been unreachable
   for ``WORKBENCH_CONTROLLER_GRACE_S`` seconds (default 10). An engine cut off from the controller
   (a link down) cannot be stopped over the network, and one waiting in a collective never reads its
   heartbeat; this is what leaves nothing running on that host. It exits when the engine exits;
4. execs ``python -m ipyparallel.engine ARGS`` (same pid, so the launcher's signals reach the engine),
   without ``--mpi``: the rank came from the environment, so mpi4py is not needed on the hosts.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time

#: Launcher variables that carry a process's rank, in the order they are tried.
RANK_VARS = ("WORKBENCH_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
DEFAULT_GRACE_S = 10.0


def rank_from(environ: dict) -> int:
    """This process's rank, from the first of :data:`RANK_VARS` that is set.

    Raises:
        RuntimeError: none is set (the engine was started by something that gives no rank).
    """
    for name in RANK_VARS:
        if environ.get(name, "") != "":
            return int(environ[name])
    raise RuntimeError(f"engine_env: no rank in the environment (looked for {', '.join(RANK_VARS)})")


def rank_environment(environ: dict) -> dict[str, str]:
    """The variables to add for this rank: its entry of ``WORKBENCH_RANK_ENVS`` and ``WORKBENCH_RANK``."""
    rank = rank_from(environ)
    envs = json.loads(environ.get("WORKBENCH_RANK_ENVS", "[]"))
    if envs and not 0 <= rank < len(envs):
        raise RuntimeError(f"engine_env: rank {rank} outside the plan's {len(envs)} ranks")
    return {**(envs[rank] if envs else {}), "WORKBENCH_RANK": str(rank)}


def controller_address(environ: dict) -> tuple[str, int] | None:
    """(ip, registration port) of the controller, from ipyparallel's ``IPP_CONNECTION_INFO``."""
    info = environ.get("IPP_CONNECTION_INFO")
    if not info:
        return None
    d = json.loads(info)
    return d["interface"].split("://", 1)[1], int(d["registration"])


def write_hostfile(content: str) -> str:
    """Path of a file holding ``content`` that lives as long as this process (and its exec)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("mlx-hostfile", 0)  # no CLOEXEC: survives the exec into the engine
        os.write(fd, content.encode())
        return f"/proc/{os.getpid()}/fd/{fd}"
    fd, path = tempfile.mkstemp(prefix="workbench-hostfile-", suffix=".json")
    os.write(fd, content.encode())
    os.close(fd)
    return path


def dead_mans_switch(engine_pid: int, address: tuple[str, int], grace_s: float, poll_s: float = 1.0) -> None:
    """Kill ``engine_pid`` once ``address`` has refused or timed out TCP connects for ``grace_s``; return when
    the engine is gone (this process is its child: its parent changes)."""
    last_ok = time.monotonic()
    while os.getppid() == engine_pid:
        try:
            socket.create_connection(address, timeout=min(2.0, grace_s)).close()
            last_ok = time.monotonic()
        except OSError:
            if time.monotonic() - last_ok > grace_s:
                print(f"engine_env: controller {address[0]}:{address[1]} unreachable for {grace_s:g} s; "
                      f"stopping engine {engine_pid}", file=sys.stderr, flush=True)
                os.kill(engine_pid, 9)
                return
        time.sleep(poll_s)


def main(argv: list[str]) -> None:
    env = rank_environment(os.environ)
    os.environ.update(env)
    hostfile = os.environ.pop("WORKBENCH_MLX_HOSTFILE_JSON", "")
    if hostfile:
        os.environ["MLX_HOSTFILE"] = write_hostfile(hostfile)
    address = controller_address(os.environ)
    grace_s = float(os.environ.get("WORKBENCH_CONTROLLER_GRACE_S", DEFAULT_GRACE_S))
    if address is not None and grace_s > 0:
        engine_pid = os.getpid()
        if os.fork() == 0:  # the switch: a child of what becomes the engine
            try:
                os.setpgid(0, 0)  # a signal to the engine's group (Ctrl-C) is the engine's to handle
                devnull = os.open(os.devnull, os.O_RDWR)
                os.dup2(devnull, 0)
                dead_mans_switch(engine_pid, address, grace_s)
            finally:
                os._exit(0)
    args = [a for a in argv if a != "--mpi"]
    os.execv(sys.executable, [sys.executable, "-m", "ipyparallel.engine", *args])


if __name__ == "__main__":
    main(sys.argv[1:])

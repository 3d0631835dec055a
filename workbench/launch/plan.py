"""Launching real multi-process runs: a pure launch plan, and a local subprocess executor.

:func:`plan_launch` decides everything a rank needs (environment, ports, the MLX ring
hostfile, the JAX coordinator) without starting anything, so it is testable without
processes. :func:`run_local` starts one process per rank on this machine, bound to
loopback, and never hangs: a rank that fails, or a run past ``timeout_s``, stops every
rank and raises :class:`LaunchError` naming the rank and the tail of its output.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from workbench.core.checks import integer

#: Backends per framework; the first is the default on CPU.
BACKENDS = {"mlx": ("ring", "mpi", "nccl"), "jax": ("gloo", "default")}


@dataclass(frozen=True, kw_only=True)
class LaunchPlan:
    """Everything needed to start ``num_ranks`` processes of one run.

    Attributes:
        framework: ``"mlx"`` or ``"jax"``.
        backend: MLX: ``"ring"``, ``"mpi"``, ``"nccl"``; JAX: ``"gloo"`` (CPU collectives) or ``"default"``.
        num_ranks: Processes to start.
        host: Address every rank binds to (loopback by default).
        ports: One port per rank (MLX ring), or one rendezvous port (MLX NCCL, the JAX coordinator;
            MLX MPI: unused, mpirun wires the ranks).
        rank_env: Per-rank environment variables (without the hostfile path, which the
            executor writes).
    """

    framework: str
    backend: str
    num_ranks: int
    host: str
    ports: tuple[int, ...]
    rank_env: tuple[dict[str, str], ...] = field(repr=False)

    @property
    def hostfile(self) -> list[list[str]] | None:
        """MLX ring hostfile content: one ``["ip:port"]`` entry per rank; ``None`` for one rank, which
        needs no backend (a one-entry ring waits 30 s for a peer, then fails: "[ring] Couldn't connect")."""
        if self.framework == "mlx" and self.backend == "ring" and self.num_ranks > 1:
            return [[f"{self.host}:{p}"] for p in self.ports]
        return None

    def write_files(self, workdir: Path) -> dict[str, str]:
        """Write the files the ranks read (the MLX ring hostfile) into ``workdir``; returns their env vars."""
        if self.hostfile is None:
            return {}
        path = Path(workdir) / "hostfile.json"
        path.write_text(json.dumps(self.hostfile))
        return {"MLX_HOSTFILE": str(path)}

    @property
    def coordinator(self) -> str | None:
        return f"{self.host}:{self.ports[0]}" if self.framework == "jax" else None


def ephemeral_port_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' ports (Linux default 32768-60999)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 49152, 65535  # IANA's dynamic range: macOS and most other systems


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports free on ``host`` right now, picked below the ephemeral range.

    A port the OS hands out (``bind(host, 0)``) comes from the ephemeral range, which every
    outgoing connection also draws from: between our check and the rank's own ``bind``, a
    gloo or ZMQ connection can take it, and the rank fails ("Failed to start RPC server",
    "Address already in use"). Ports below that range are only ever taken by an explicit
    listener, so the window is closed but for other listeners picking at random too.
    """
    low = max(ephemeral_port_range()[0], 2048)
    pool = range(max(1024, low - 12000), low)
    candidates = random.sample(pool, min(count * 64, len(pool)))
    ports = []
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == count:
            return ports
    raise RuntimeError(f"free_ports: no {count} free port(s) on {host} below the ephemeral range "
                       f"(tried {len(candidates)} in {pool.start}-{pool.stop - 1}).")


#: Thread pools sized per rank (as torchrun sets OMP_NUM_THREADS for several processes per host).
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def thread_env(ranks_per_host: int, cores: int | None = None) -> dict[str, str]:
    """Each rank's share of the host's cores for NumPy's and OpenMP's thread pools.

    Without it, every rank's BLAS starts one thread per core, and ranks sharing a host fight over
    them: ``np.linalg.eig`` of a 512 x 512 matrix took 1.74 s with OpenBLAS's default threads on
    2 cores against 0.31 s with one. A variable already set in this process's environment is kept.
    """
    cores = cores or os.cpu_count() or 1
    share = str(max(1, cores // max(1, ranks_per_host)))
    return {name: os.environ.get(name, share) for name in THREAD_VARS}


def plan_launch(
    num_ranks: int,
    *,
    framework: str = "mlx",
    backend: str | None = None,
    host: str = "127.0.0.1",
    ports: list[int] | None = None,
    env: dict[str, str] | None = None,
) -> LaunchPlan:
    """Plan a run of ``num_ranks`` processes (pure: starts nothing; ports are given or picked free).

    Raises:
        ValueError: naming the field: ``num_ranks < 1``, an unknown framework or backend,
            or the wrong number of ports.
    """
    num_ranks = integer("num_ranks", num_ranks, low=1)
    if framework not in BACKENDS:
        raise ValueError(f"Unknown framework {framework!r}; choose one of {', '.join(BACKENDS)}.")
    backend = backend or BACKENDS[framework][0]
    if backend not in BACKENDS[framework]:
        raise ValueError(f"Unknown {framework} backend {backend!r}; choose one of {', '.join(BACKENDS[framework])}.")
    needed = num_ranks if (framework, backend) == ("mlx", "ring") else 1
    ports = list(ports) if ports is not None else free_ports(needed, host)
    if len(ports) != needed:
        raise ValueError(f"ports: {framework} with {num_ranks} ranks needs {needed} port(s), got {len(ports)}.")
    base = {**thread_env(num_ranks), **(env or {})}
    rank_env = []
    for r in range(num_ranks):
        e = dict(base)
        if framework == "mlx":
            e.update(MLX_RANK=str(r), WORKBENCH_BACKEND=backend)
            if backend == "nccl":  # one GPU per rank; rank 0 hosts NCCL's rendezvous
                e.update(MLX_WORLD_SIZE=str(num_ranks), NCCL_HOST_IP=host, NCCL_PORT=str(ports[0]),
                         CUDA_VISIBLE_DEVICES=str(r))
        else:
            e.update(
                WORKBENCH_COORDINATOR=f"{host}:{ports[0]}",
                WORKBENCH_NUM_PROCESSES=str(num_ranks),
                WORKBENCH_PROCESS_ID=str(r),
                WORKBENCH_BACKEND=backend,
                XLA_FLAGS="--xla_force_host_platform_device_count=1",
                JAX_PLATFORMS="cpu" if backend == "gloo" else e.get("JAX_PLATFORMS", ""),
            )
        rank_env.append(e)
    return LaunchPlan(framework=framework, backend=backend, num_ranks=num_ranks, host=host,
                      ports=tuple(ports), rank_env=tuple(rank_env))


class LaunchError(RuntimeError):
    """A rank failed or the run timed out; ``rank`` names the first rank at fault (None: timeout)."""

    def __init__(self, message: str, rank: int | None, outputs: list[str]):
        super().__init__(message)
        self.rank = rank
        self.outputs = outputs


@dataclass(frozen=True)
class RankResult:
    rank: int
    returncode: int
    output: str


#: MPI_THREAD_MULTIPLE in Open MPI's numbering, for ``OMPI_MPI_THREAD_LEVEL``.
OMPI_THREAD_MULTIPLE = 3


def mpirun_command(plan: LaunchPlan, argv: list[str]) -> list[str]:
    """The ``mpirun`` command that starts ``python argv...`` on every rank of an MPI plan, on loopback.

    MLX's MPI backend calls ``MPI_Init`` (thread level MPI_THREAD_SINGLE) but then calls MPI from
    several threads at once: one per MLX stream, and the ring transport sends on one stream while it
    receives on another. Under MPI_THREAD_SINGLE Open MPI takes no locks, so those calls race: about
    1 launch in 50 of the HSDP check died in ``PMPI_Allreduce``/``MPI_Allgather`` (SIGSEGV) or
    ``mca_pml_ob1_send`` ("free(): invalid pointer"), after "connect() to 127.0.0.1:... failed:
    Operation now in progress (115)". ``OMPI_MPI_THREAD_LEVEL`` makes Open MPI's ``MPI_Init`` ask for
    MPI_THREAD_MULTIPLE instead (measured: 12 of 400 launches failed before, 0 of 650 after, same wall time;
    the shared memory BTL alone did not remove the race in a small two-stream send/recv reproducer).
    """
    return ["mpirun", "--oversubscribe", "-np", str(plan.num_ranks),
            *(["--allow-run-as-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []),
            "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo",
            "-x", f"OMPI_MPI_THREAD_LEVEL={OMPI_THREAD_MULTIPLE}",
            sys.executable, *argv]


def run_worker(plan: LaunchPlan, module: str, out: Path, *args: str, timeout_s: float = 120.0,
               workdir: Path | None = None) -> list[dict]:
    """Run ``python -m module --out OUT *args`` on every rank (:func:`run_local`) and return what each
    rank wrote to ``OUT/rank{r}.json``, in rank order (the workers' convention: plain JSON, no arrays).

    Raises:
        LaunchError: as :func:`run_local`.
    """
    out = Path(out)
    run_local(plan, ["-m", module, "--out", str(out), *args], timeout_s=timeout_s, workdir=workdir)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(plan.num_ranks)]


def run_local(plan: LaunchPlan, argv: list[str], *, timeout_s: float = 120.0, workdir: Path | None = None) -> list[RankResult]:
    """Run ``python argv...`` once per rank of ``plan`` on this machine and wait for all.

    MLX's MPI backend is started through one ``mpirun`` (ranks come from MPI; the output of
    every rank is in the single result); every other plan starts one process per rank.

    Args:
        plan: From :func:`plan_launch`.
        argv: Arguments after the Python executable (e.g. ``["-m", "workbench.ranks.mlx_step_timing", ...]``).
        timeout_s: Wall-clock limit for the whole run.
        workdir: Where the hostfile and rank logs go (default: a temporary folder).

    Raises:
        LaunchError: a rank exited non-zero (every other rank is stopped), or the run timed out.
    """
    own_tmp = None
    if workdir is None:
        own_tmp = tempfile.TemporaryDirectory(prefix="workbench-launch-")
        workdir = Path(own_tmp.name)
    workdir.mkdir(parents=True, exist_ok=True)
    base_env = {**os.environ, **plan.write_files(workdir)}
    mpi = plan.framework == "mlx" and plan.backend == "mpi"
    commands = [mpirun_command(plan, argv)] if mpi else [[sys.executable, *argv]] * plan.num_ranks
    logs = [workdir / f"rank{r}.log" for r in range(len(commands))]
    procs = []
    try:
        for r, command in enumerate(commands):
            env = {**base_env, **plan.rank_env[r]}
            if mpi:
                env.pop("MLX_RANK", None)
            with open(logs[r], "w") as log:
                procs.append(subprocess.Popen(
                    command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                ))
        deadline = time.monotonic() + timeout_s
        failed = None
        while time.monotonic() < deadline:
            codes = [p.poll() for p in procs]
            failed = next((r for r, c in enumerate(codes) if c not in (None, 0)), None)
            if failed is not None or all(c == 0 for c in codes):
                break
            time.sleep(0.05)
        stuck = [r for r, p in enumerate(procs) if p.poll() is None]
        timed_out = failed is None and bool(stuck)
        _stop(procs)
        outputs = [log.read_text(errors="replace") for log in logs]
        if failed is not None:
            raise LaunchError(
                f"{'mpirun' if mpi else f'rank {failed} of {plan.num_ranks}'} exited with code {procs[failed].returncode}; "
                f"the other ranks were stopped. Its output ends:\n{outputs[failed][-3000:]}", None if mpi else failed, outputs)
        if timed_out:
            raise LaunchError(
                f"run timed out after {timeout_s:.0f} s (ranks {stuck} still running, stopped). "
                f"Process {stuck[0]}'s output ends:\n{outputs[stuck[0]][-3000:]}", None, outputs)
        return [RankResult(r, p.returncode, outputs[r]) for r, p in enumerate(procs)]
    finally:
        _stop(procs)
        if own_tmp is not None:
            own_tmp.cleanup()


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, 9)
            except ProcessLookupError:
                pass
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

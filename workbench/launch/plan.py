"""The launch plan of a real multi-process run, pure.

:func:`plan_launch` decides everything a rank needs (environment, ports, the MLX ring
hostfile, the JAX coordinator) without starting anything, so it is testable without
processes. :mod:`workbench.launch.local_run` starts a plan's ranks as subprocesses;
:mod:`workbench.launch.engines` as ipyparallel engines.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import socket
from dataclasses import dataclass, field
from pathlib import Path

from workbench.adapters.jax.compile_cache import compile_cache_dir
from workbench.adapters.mlx.blas import blas_choice, mlx_rank_env
from workbench.core.checks import integer
from workbench.core.envvars import RING_PIECE_BYTES, RING_PIECE_ENV, ring_piece_bytes
from workbench.core.fingerprint import LAUNCH_ENV

#: Hosts that are this machine: MLX ranks there get OpenBLAS (:mod:`workbench.adapters.mlx.blas`).
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
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
    listener, so the window is closed but for other listeners picking at random too. They are drawn
    from the system's entropy, never from Python's global generator (which a model's seed sets).
    """
    low = max(ephemeral_port_range()[0], 2048)
    pool = range(max(1024, low - 12000), low)
    # never the global generator: the driver seeds it (init_seed) as it builds a user's model, and two drivers that
    # did so drew the same ports, so one run's last rank joined the other's rank 0 (ranks disagree on 'paths')
    candidates = random.SystemRandom().sample(pool, min(count * 64, len(pool)))
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
    2 cores against 0.31 s with one. Also the size of the pieces MLX's ring ranks gather FSDP's buckets in
    (:data:`~workbench.core.envvars.RING_PIECE_ENV`, always set, so every rank of a plan gathers alike): 256 KiB
    where the ranks outnumber half the cores (each rank's socket threads poll a core while they wait, and one
    message split over two of them stalled for whole scheduler ticks), else 0 (one call); plan_launch keeps it for
    MLX's ring ranks only. ``cores`` defaults to this machine's (a hosts file's ranks: the most crowded host's count
    against its ``cores``, or this machine's where the file gives none). A variable already set in this process's
    environment is kept.
    """
    cores = cores or os.cpu_count() or 1
    share = str(max(1, cores // max(1, ranks_per_host)))
    pieces = os.environ.get(RING_PIECE_ENV, str(RING_PIECE_BYTES) if 2 * ranks_per_host > cores else "0")
    return {**{name: os.environ.get(name, share) for name in THREAD_VARS}, RING_PIECE_ENV: pieces}


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
            the wrong number of ports, (JAX) a bad ``$WORKBENCH_JAX_CACHE``, or (MLX) a bad
            ``$WORKBENCH_MLX_BLAS``.
    """
    num_ranks = integer("num_ranks", num_ranks, low=1)
    if framework not in BACKENDS:
        raise ValueError(f"Unknown framework {framework!r}; choose one of {', '.join(BACKENDS)}.")
    backend = backend or BACKENDS[framework][0]
    if backend not in BACKENDS[framework]:
        raise ValueError(f"Unknown {framework} backend {backend!r}; choose one of {', '.join(BACKENDS[framework])}.")
    if framework == "jax":
        compile_cache_dir()  # a bad $WORKBENCH_JAX_CACHE is refused here, before any engine starts
    blas = {}
    if framework == "mlx":  # OpenBLAS under a rank on this machine (a bad $WORKBENCH_MLX_BLAS is refused)
        blas_choice()
        blas = mlx_rank_env() if host in LOCAL_HOSTS else {}
    needed = num_ranks if (framework, backend) == ("mlx", "ring") else 1
    ports = list(ports) if ports is not None else free_ports(needed, host)
    if len(ports) != needed:
        raise ValueError(f"ports: {framework} with {num_ranks} ranks needs {needed} port(s), got {len(ports)}.")
    # one value for every rank of this launch (never the caller's: a copied environment would carry another's), compared
    # first before step 0: a rank of another launch that drew a port alike is told apart, and the launch tried again
    base = {**thread_env(num_ranks), **(env or {}), LAUNCH_ENV: secrets.token_hex(8)}
    rank_env = []
    for r in range(num_ranks):
        e = dict(base)
        if framework == "mlx":
            e.update(MLX_RANK=str(r), WORKBENCH_BACKEND=backend, **blas)
            if backend != "ring":  # the pieces are for the ring's polling socket threads: none here
                e[RING_PIECE_ENV] = "0"
            ring_piece_bytes(e)  # a bad value (the caller's, or this process's) is refused before any rank starts
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
            e.pop(RING_PIECE_ENV, None)  # MLX's ring ranks' alone
        rank_env.append(e)
    return LaunchPlan(framework=framework, backend=backend, num_ranks=num_ranks, host=host,
                      ports=tuple(ports), rank_env=tuple(rank_env))

"""A launch plan's ranks as subprocesses on this machine: :func:`run_local` (and :func:`run_worker`, its JSON
convention), or under ``mpirun`` (:func:`mpirun_command`).

:func:`run_local` starts one process per rank of a :class:`~workbench.launch.plan.LaunchPlan`, bound to
loopback, and never hangs: a rank that fails, or a run past ``timeout_s``, stops every rank and raises
:class:`LaunchError` naming the rank and the tail of its output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from workbench.launch.plan import LaunchPlan


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

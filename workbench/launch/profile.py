"""Profile a run's model once, on one process, and keep the profile beside the runs (issue 26).

:func:`profile_model` returns the cached :class:`~workbench.runs.profile.ModelProfile` of a run's model, or
measures it: ``python -m workbench.ranks.profile_mlx`` (or ``profile_jax``) in a subprocess with the thread
pools a rank of the run gets (:func:`~workbench.launch.plan.thread_env`), as many processes at once as the run
puts ranks on a host (they meet at a barrier before they measure, and each one's seconds go into the samples:
the ranks of a run compete for the cores, and so do these), bounded by ``timeout_s``, each in a session of its
own that is ended with the call (and that ends itself if this process dies). The profile records what it
cost: its wall seconds and one profiling process's peak memory.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from workbench.adapters.mlx.blas import BLAS_ENV, mlx_rank_env
from workbench.launch.plan import thread_env
from workbench.runs.profile import (
    ModelProfile,
    load_profile,
    profile_from_measurements,
    profile_key_fields,
    profile_path,
    save_profile,
)

#: The program that measures each framework's model.
PROFILE_PROGRAMS = {"mlx": "workbench.ranks.profile_mlx", "jax": "workbench.ranks.profile_jax"}


def default_micro_batch_sizes(micro_batch_size: int) -> tuple[int, ...]:
    """The run's micro-batch, its half and its quarter (at least two distinct sizes: 1 gives 1 and 2)."""
    sizes = sorted({max(1, micro_batch_size // 4), max(1, micro_batch_size // 2), micro_batch_size})
    return tuple(sizes) if len(sizes) > 1 else (1, 2)


def profile_model(spec: Any, runs_root: str | Path, *, micro_batch_sizes: Sequence[int] | None = None,
                  repeats: int = 3, ranks_per_host: int | None = None, refresh: bool = False,
                  timeout_s: float = 600.0, remote_ranks: bool = False) -> ModelProfile:
    """The profile of ``spec``'s model (a :class:`~workbench.runs.spec.RunSpec`), from the cache or measured now.

    Args:
        spec: The run whose model, precision, tokens, optimizer and framework are profiled.
        runs_root: The run store's folder; the profile is ``<runs_root>/.profiles/<framework>-<key>.json``.
        micro_batch_sizes: Sizes to measure (default :func:`default_micro_batch_sizes` of the run's). Ignored
            when a cached profile is used: its line serves every size.
        repeats: Measurements per size (activations: their largest; seconds: their median, so three by default:
            of two, the median would be the slower).
        ranks_per_host: Ranks sharing this machine (default ``spec.num_ranks``): the profile runs that many
            processes at once, each with one rank's share of the cores; both are part of the cache key.
        refresh: Measure even if a profile is cached (and replace it).
        timeout_s: Longest the profiling process may take, in seconds.
        remote_ranks: The run's ranks are on other hosts, where an MLX rank runs MLX's own BLAS (the OpenBLAS
            shim is this machine's: :func:`~workbench.launch.plan.plan_launch`), so the profile does too.

    Raises:
        ProfileError: the cached file cannot be read as a profile (named; it is left as it was).
        ValueError: a bad argument (named).
        TimeoutError: the profile took longer than ``timeout_s`` (its process is killed; nothing is stored).
        RuntimeError: the profiling process failed; the message ends with its output.
    """
    co_runners = ranks_per_host or spec.num_ranks
    if isinstance(co_runners, bool) or not isinstance(co_runners, int) or co_runners < 1:
        raise ValueError(f"ranks_per_host={ranks_per_host!r}: an integer >= 1")
    threads_env = thread_env(co_runners)
    threads = threads_env["OMP_NUM_THREADS"]
    env = {**os.environ, **threads_env, **({BLAS_ENV: "reference"} if remote_ranks else {})}
    key_fields = profile_key_fields(spec, int(threads) if threads.isdigit() else threads, co_runners, env)
    path = profile_path(runs_root, key_fields)
    if path.exists() and not refresh:
        return load_profile(path)
    sizes = tuple(micro_batch_sizes) if micro_batch_sizes is not None else default_micro_batch_sizes(
        spec.micro_batch_size)
    if len(set(sizes)) < 2 or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in sizes):
        raise ValueError(f"micro_batch_sizes={sizes!r}: two or more distinct integers >= 1 (a line needs two points)")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r}: an integer >= 1")
    if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
        raise ValueError(f"timeout_s={timeout_s!r}: a number of seconds > 0")
    if spec.framework == "jax":  # a JAX rank's one CPU device, and a second for XLA's plan of the step on a mesh
        env.update(XLA_FLAGS="--xla_force_host_platform_device_count=2",
                   JAX_PLATFORMS=env.get("JAX_PLATFORMS") or "cpu")
    else:  # as plan_launch gives an MLX rank on this machine: OpenBLAS where it can be had
        env.update(mlx_rank_env(env))
    with tempfile.TemporaryDirectory(prefix="wb-profile-") as tmp:
        spec_file, outs = Path(tmp) / "spec.json", [Path(tmp) / f"profile{i}.json" for i in range(co_runners)]
        spec_file.write_text(json.dumps(spec.to_dict()))
        argvs = [[sys.executable, "-m", PROFILE_PROGRAMS[spec.framework], "--spec", str(spec_file),
                  "--sizes", ",".join(str(b) for b in sorted(set(sizes))), "--repeats", str(repeats),
                  "--out", str(out), "--peers", str(co_runners), "--peer-index", str(i), "--peer-dir", tmp]
                 for i, out in enumerate(outs)]
        what = f"the {spec.framework} profile of {_model_name(spec)}"
        t0 = time.perf_counter()
        output = _run_bounded(argvs, env, timeout_s, what=what)
        cost_s = time.perf_counter() - t0
        missing = [str(out) for out in outs if not out.is_file()]
        if missing:
            raise RuntimeError(f"{what} wrote no result in {missing}; its output ended:\n{output[-2000:]}")
        measured = merge_co_runners([json.loads(out.read_text()) for out in outs])
    profile = profile_from_measurements(measured, key_fields, cost_s)
    save_profile(path, profile)
    return profile


#: What every co-running process measured, pooled size by size: seconds, and the activations' bytes (whose largest
#: the fit takes: the more samples, the surer it meets the higher of a small model's peaks, see profile_mlx).
POOLED_SAMPLES = ("compute_s_samples", "forward_s_samples", "activation_samples", "zero3_rise_samples")


def merge_co_runners(results: Sequence[dict]) -> dict:
    """One measurement from what ``len(results)`` processes measured at once: the first process's state bytes, every
    process's seconds and activation bytes (each size's samples pooled; the update's median over the processes),
    the largest resident peak, and ``co_runners``."""
    if not results:
        raise ValueError("merge_co_runners: no results")
    merged = {**results[0], "co_runners": len(results)}
    for name in POOLED_SAMPLES:
        rows = [r.get(name) for r in results]
        if all(row is not None for row in rows):
            merged[name] = [[v for row in rows for v in row[i]] for i in range(len(rows[0]))]
    for name in ("step_s_samples", "step_bare_s_samples", "step_update_s_samples"):  # at one size: one list each
        if all(r.get(name) is not None for r in results):
            merged[name] = [v for r in results for v in r[name]]
    merged["update_s"] = float(sorted(r["update_s"] for r in results)[len(results) // 2])
    merged["peak_rss_bytes"] = max(r["peak_rss_bytes"] for r in results)
    return merged


def _model_name(spec: Any) -> str:
    return spec.model_factory or f"the built-in LM {dict(spec.model)}"


def _run_bounded(argvs: list[list[str]], env: dict[str, str], timeout_s: float, *, what: str) -> str:
    """Run each of ``argvs`` at once, each in a session of its own, output to one file; return that output.
    Whatever happens, every session is killed before returning (nothing the programs started outlives the
    call); the first to fail fails the call, and the others are stopped."""
    with tempfile.TemporaryFile() as log:
        children = [subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True) for argv in argvs]
        deadline, codes = time.monotonic() + timeout_s, [None] * len(children)
        try:
            while any(c is None for c in codes) and not any(c not in (None, 0) for c in codes):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{what} took longer than timeout_s={timeout_s:g} s (its processes were "
                                       "stopped; nothing was stored)")
                codes = [child.poll() for child in children]
                time.sleep(0.02)
        finally:
            for child in children:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        log.seek(0)
        output = log.read().decode("utf-8", "replace")
    failed = [c for c in codes if c not in (None, 0)]
    if failed:
        raise RuntimeError(f"{what} failed (exit code {failed[0]}); its output ended:\n{output[-2000:]}")
    return output

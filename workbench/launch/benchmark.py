"""A collective benchmark in the style of nccl-tests, on real engines, stored like runs.

:func:`run_collective_benchmark` starts one ipyparallel engine per rank (MLX ring or JAX
``jax.distributed`` over gloo, as training runs do), times all-reduce, all-gather and
reduce-scatter over message sizes, and stores the result in a run record. Sizes follow
nccl-tests: ``size_bytes`` is the all-reduce buffer, the all-gather output and the
reduce-scatter input (V); ``algbw = V / t``, ``busbw = algbw * factor``
(:func:`workbench.estimate.comm.bus_factor`). A collective ends when its slowest rank ends, so a
size's time is the maximum over ranks of each rank's median. :func:`workbench.studies.step_time.fit_links` fits the
alpha-beta model of :mod:`workbench.estimate.comm` to the stored points, per framework and kind.

MLX's CPU backends have no ``sum_scatter``: its reduce-scatter here is the workbench's ring
(:func:`workbench.adapters.mlx.transport.ring_reduce_scatter`), the path FSDP takes on CPU.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from workbench.core.checks import as_whole
from workbench.core.events import emit
from workbench.launch.engines import EngineFailure
from workbench.launch.hosts import most_crowded, place_ranks
from workbench.launch.remote import Placement
from workbench.ranks.collective_timing import bench_rank
from workbench.runs.store import RunStore, run_id_for
from workbench.strategies import COLLECTIVE_KINDS

if TYPE_CHECKING:
    pass

KINDS = COLLECTIVE_KINDS  # (workbench.strategies)
#: nccl-tests' usual sweep, 1 KiB to 256 MiB by factors of 2.
FULL_SIZES = tuple(2**k for k in range(10, 29))
#: The build's default: 1 KiB to 64 MiB by factors of 4 (the latency- and the bandwidth-bound ends).
DEFAULT_SIZES = tuple(2**k for k in range(10, 27, 2))
SMALL_SIZES = tuple(2**k for k in range(12, 27, 2))  # 4 KiB to 64 MiB: bandwidth dominates the largest even under load


def benchmark_spec(framework: str, num_ranks: int, sizes_bytes: Sequence[int] = FULL_SIZES,
                   kinds: Sequence[str] = KINDS, iters: int = 5, ranks_per_host: int | None = None,
                   cores: int | None = None) -> dict:
    """The record spec of one benchmark (validated: the error names the field).

    ``barrier`` (MLX): where the most crowded host's ranks (``ranks_per_host``, default ``num_ranks``) outnumber
    its ``cores`` (default this machine's), ``"each call"``: every timed call follows a barrier, as a step's
    collective follows its ranks' compute, each rank waiting for cores; else ``"each size"``: the calls of a size
    back to back after one, as a step issues its buckets. Fitted on each and set against the advisor's validated
    runs on 2 cores: at 2 ranks, back to back priced the 3-block test LM's steps within 1-8% and a barrier each
    call 13-25% over (it made the call after it meet a 4 ms tick in 30-70% of calls, back to back 0-5%); at 4
    ranks, back to back priced the three benchmark models' steps at 0.35-0.52 of their measure, a barrier each
    call at 0.6-1.2."""
    if framework not in ("mlx", "jax"):
        raise ValueError(f"framework={framework!r}: choose 'mlx' or 'jax'.")
    if as_whole(num_ranks) is None or as_whole(num_ranks) < 2:
        raise ValueError(f"num_ranks={num_ranks!r}: a collective needs an integer >= 2 ranks.")
    num_ranks = as_whole(num_ranks)
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise ValueError(f"kinds={list(kinds)!r}: choose from {', '.join(KINDS)}.")
    quantum = 4 * num_ranks  # fp32 elements that split evenly over the ranks
    for s in sizes_bytes:
        if as_whole(s) is None or s < quantum or s % quantum:
            raise ValueError(f"sizes_bytes has {s!r}: each size must be a positive multiple of {quantum} bytes "
                             f"(fp32 elements divisible by {num_ranks} ranks).")
    if as_whole(iters) is None or iters < 1:
        raise ValueError(f"iters={iters!r}: must be an integer >= 1.")
    iters = as_whole(iters)
    crowded = (ranks_per_host or num_ranks) > (cores or os.cpu_count() or 1)
    return {"kind": "collectives", "framework": framework, "num_ranks": num_ranks,
            "sizes_bytes": [int(s) for s in sizes_bytes], "kinds": list(kinds), "iters": iters, "dtype": "float32",
            **({"barrier": "each call" if crowded else "each size"} if framework == "mlx" else {})}


def run_collective_benchmark(root: Path | str, framework: str = "mlx", num_ranks: int = 2, *,
                             sizes_bytes: Sequence[int] = FULL_SIZES, kinds: Sequence[str] = KINDS, iters: int = 5,
                             timeout_s: float = 900.0, skip_done: bool = True, hosts=None, launcher: str = "ssh") -> str:
    """Time collectives on ``num_ranks`` real engines and store the result under ``root``.

    With ``hosts`` (a hosts file, see :mod:`workbench.launch.hosts`) the engines run on those hosts,
    started by ipyparallel's ``launcher``; the spec then carries ``"placement"`` (launcher and the hosts'
    addresses and slots), so the record is stored beside the loopback one, not in its place.

    Returns:
        The run id. A benchmark already stored and done is skipped (its id returned).

    Raises:
        ValueError: on a bad knob (named), before any engine starts.
        RuntimeError: the benchmark failed (an engine died, or ``timeout_s`` passed); the failure
            is recorded in the store first, naming the rank where known.
    """
    placement = Placement.of(hosts, launcher)  # a bad hosts file or launcher is refused before anything starts
    per_host, cores = (None, None) if placement.hosts is None else most_crowded(
        placement.hosts, place_ranks(placement.hosts, num_ranks))
    spec = benchmark_spec(framework, num_ranks, sizes_bytes, kinds, iters, per_host, cores)
    runner = placement.runner()
    if placement.hosts is not None:
        spec["placement"] = placement.record()
    store = RunStore(Path(root))
    label = f"collective benchmark {framework}, {num_ranks} ranks, {len(spec['sizes_bytes'])} sizes"
    if skip_done and store.is_done(spec):
        emit("run_end", index=None, runs=None, label=label, status="skipped", seconds=0.0, error=None,
             run_id=run_id_for(spec))
        return run_id_for(spec)
    handle = store.create(spec, meta={"backend": "ring" if framework == "mlx" else "gloo"})
    emit("run_start", index=None, runs=None, label=label, steps=None, run_id=handle.run_id)
    t0 = time.monotonic()
    try:
        ranks = runner(num_ranks, framework,
                       lambda engines: engines.apply(bench_rank, [(spec,)] * num_ranks, timeout_s=timeout_s))
    except EngineFailure as err:
        handle.fail(str(err), err.rank)
        emit("run_end", index=None, runs=None, label=label, status="failed", seconds=time.monotonic() - t0,
             error=str(err), run_id=handle.run_id)
        raise RuntimeError(f"collective benchmark {handle.run_id} failed: {err}") from err
    except BaseException as err:
        handle.fail(f"{type(err).__name__}: {err}", None)
        raise
    handle.finish({"ranks": ranks})
    emit("run_end", index=None, runs=None, label=label, status="done", seconds=time.monotonic() - t0, error=None,
         run_id=handle.run_id)
    return handle.run_id



"""A collective benchmark in the style of nccl-tests, on real engines, stored like runs.

:func:`run_collective_benchmark` starts one ipyparallel engine per rank (MLX ring or JAX
``jax.distributed`` over gloo, as training runs do), times all-reduce, all-gather and
reduce-scatter over message sizes, and stores the result in a run record. Sizes follow
nccl-tests: ``size_bytes`` is the all-reduce buffer, the all-gather output and the
reduce-scatter input (V); ``algbw = V / t``, ``busbw = algbw * factor``
(:func:`workbench.estimate.comm.bus_factor`). A collective ends when its slowest rank ends, so a
size's time is the maximum over ranks of each rank's median. :func:`fit_links` fits the
alpha-beta model of :mod:`workbench.estimate.comm` to the stored points, per framework and kind.

MLX's CPU backends have no ``sum_scatter``: its reduce-scatter here is the workbench's ring
(:func:`workbench.adapters.mlx.fsdp.ring_reduce_scatter`), the path FSDP takes on CPU.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from workbench.estimate.comm import AlphaBeta, bus_factor, fit_alpha_beta, ring_steps
from workbench.launch.engines import EngineFailure, run_on_fresh_ports
from workbench.publish.buildlog import emit
from workbench.runs.store import RunStore, run_id_for

if TYPE_CHECKING:
    import pandas as pd

KINDS = ("all_reduce", "all_gather", "reduce_scatter")
#: nccl-tests' usual sweep, 1 KiB to 256 MiB by factors of 2.
FULL_SIZES = tuple(2**k for k in range(10, 29))
#: The build's default: 1 KiB to 64 MiB by factors of 4 (the latency- and the bandwidth-bound ends).
DEFAULT_SIZES = tuple(2**k for k in range(10, 27, 2))
SMALL_SIZES = tuple(2**k for k in range(12, 27, 2))  # 4 KiB to 64 MiB: bandwidth dominates the largest even under load


def benchmark_spec(framework: str, num_ranks: int, sizes_bytes: Sequence[int] = FULL_SIZES,
                   kinds: Sequence[str] = KINDS, iters: int = 5) -> dict:
    """The record spec of one benchmark (validated: the error names the field)."""
    if framework not in ("mlx", "jax"):
        raise ValueError(f"framework={framework!r}: choose 'mlx' or 'jax'.")
    if isinstance(num_ranks, bool) or not isinstance(num_ranks, int) or num_ranks < 2:
        raise ValueError(f"num_ranks={num_ranks!r}: a collective needs an integer >= 2 ranks.")
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise ValueError(f"kinds={list(kinds)!r}: choose from {', '.join(KINDS)}.")
    quantum = 4 * num_ranks  # fp32 elements that split evenly over the ranks
    for s in sizes_bytes:
        if isinstance(s, bool) or not isinstance(s, int) or s < quantum or s % quantum:
            raise ValueError(f"sizes_bytes has {s!r}: each size must be a positive multiple of {quantum} bytes "
                             f"(fp32 elements divisible by {num_ranks} ranks).")
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 1:
        raise ValueError(f"iters={iters!r}: must be an integer >= 1.")
    return {"kind": "collectives", "framework": framework, "num_ranks": num_ranks,
            "sizes_bytes": [int(s) for s in sizes_bytes], "kinds": list(kinds), "iters": iters, "dtype": "float32"}


def _iters_for(size_bytes: int, iters: int) -> int:
    """More repetitions for small messages (noise), never fewer than ``iters``."""
    return max(iters, min(50, (1 << 22) // size_bytes))


def _bench_mlx(spec: dict) -> dict:
    import mlx.core as mx

    from workbench.adapters.mlx.fsdp import _reduce_scatter, has_sum_scatter

    group = mx.distributed.init(backend=os.environ.get("WORKBENCH_BACKEND", "ring"), strict=True)
    n = group.size()
    rs_path = "sum_scatter" if has_sum_scatter(group) else "ring"
    barrier = mx.zeros((1,))
    out = {}
    for kind in spec["kinds"]:
        for size in spec["sizes_bytes"]:
            elems = size // 4
            x = mx.ones((elems if kind != "all_gather" else elems // n,), dtype=mx.float32)
            mx.eval(x)

            def op():
                if kind == "all_reduce":
                    return mx.distributed.all_sum(x, group=group)
                if kind == "all_gather":
                    return mx.distributed.all_gather(x, group=group)
                c = elems // n
                return _reduce_scatter(lambda k: x[k * c:(k + 1) * c], group, rs_path, None)

            times = []
            for i in range(_iters_for(size, spec["iters"]) + 2):
                mx.eval(mx.distributed.all_sum(barrier, group=group))  # ranks start together
                t0 = time.perf_counter()
                mx.eval(op())
                if i >= 2:  # two warm-up calls
                    times.append(time.perf_counter() - t0)
            out[f"{kind}:{size}"] = times
    return {"rank": group.rank(), "times_s": out, "paths": {"reduce_scatter": rs_path}}


def _bench_jax(spec: dict) -> dict:
    from workbench.ranks.train_jax import init_distributed

    rank, n = init_distributed()
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from workbench.adapters.jax.fsdp import _smap

    mesh = Mesh(np.array(sorted(jax.devices(), key=lambda d: (d.process_index, d.id))), ("x",))
    bodies = {
        "all_reduce": lambda a: jax.lax.psum(a, "x"),
        "all_gather": lambda a: jax.lax.all_gather(a, "x", tiled=True),
        "reduce_scatter": lambda a: jax.lax.psum_scatter(a, "x", tiled=True),
    }
    out = {}
    for kind in spec["kinds"]:
        fn = _smap(bodies[kind], mesh, P("x"), P("x"), True)
        for size in spec["sizes_bytes"]:
            local = size // 4 if kind != "all_gather" else size // 4 // n
            x = jax.make_array_from_callback((local * n,), NamedSharding(mesh, P("x")),
                                             lambda idx: np.ones(local, np.float32))
            jax.block_until_ready(fn(x))  # compile
            times = []
            for i in range(_iters_for(size, spec["iters"]) + 2):
                t0 = time.perf_counter()
                jax.block_until_ready(fn(x))
                if i >= 2:
                    times.append(time.perf_counter() - t0)
            out[f"{kind}:{size}"] = times
            del x
    return {"rank": rank, "times_s": out, "paths": {"reduce_scatter": "psum_scatter"}}


def bench_rank(spec: dict) -> dict:
    """One rank's part of the benchmark (runs on an engine; returns plain data)."""
    from workbench.launch.driver import _versions

    result = _bench_mlx(spec) if spec["framework"] == "mlx" else _bench_jax(spec)
    return {**result, "versions": _versions()}


def run_collective_benchmark(root: Path | str, framework: str = "mlx", num_ranks: int = 2, *,
                             sizes_bytes: Sequence[int] = FULL_SIZES, kinds: Sequence[str] = KINDS, iters: int = 5,
                             timeout_s: float = 900.0, skip_done: bool = True) -> str:
    """Time collectives on ``num_ranks`` real engines and store the result under ``root``.

    Returns:
        The run id. A benchmark already stored and done is skipped (its id returned).

    Raises:
        ValueError: on a bad knob (named), before any engine starts.
        RuntimeError: the benchmark failed (an engine died, or ``timeout_s`` passed); the failure
            is recorded in the store first, naming the rank where known.
    """
    spec = benchmark_spec(framework, num_ranks, sizes_bytes, kinds, iters)
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
        ranks = run_on_fresh_ports(num_ranks, framework,
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


def load_collective_benchmarks(root: Path | str) -> "pd.DataFrame":
    """Stored benchmarks under ``root`` as one row per (run, kind, size): ``time_s`` (max over
    ranks of each rank's median), ``algbw_bytes_per_s``, ``busbw_bytes_per_s``, ``rank_bytes``
    (bytes each rank sends: ``V * bus factor``) and ``num_steps`` (ring latency terms)."""
    import pandas as pd

    rows = []
    root = Path(root)
    for folder in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        record = RunStore(root).load_record(folder.name)
        if not record or record.get("status") != "done" or record["spec"].get("kind") != "collectives":
            continue
        spec, ranks = record["spec"], record["summary"]["ranks"]
        n = spec["num_ranks"]
        for key in ranks[0]["times_s"]:
            kind, size = key.split(":")
            size = int(size)
            t = max(statistics.median(r["times_s"][key]) for r in ranks)
            rows.append({"run_id": record["run_id"], "framework": spec["framework"], "num_ranks": n, "kind": kind,
                         "size_bytes": size, "time_s": t, "algbw_bytes_per_s": size / t,
                         "busbw_bytes_per_s": size / t * bus_factor(kind, n), "rank_bytes": size * bus_factor(kind, n),
                         "num_steps": ring_steps(kind, n), "path": ranks[0]["paths"].get(kind, kind)})
    columns = ["run_id", "framework", "num_ranks", "kind", "size_bytes", "time_s", "algbw_bytes_per_s",
               "busbw_bytes_per_s", "rank_bytes", "num_steps", "path"]
    return pd.DataFrame(rows, columns=columns).sort_values(["framework", "kind", "size_bytes"], ignore_index=True)


def fit_links(table: "pd.DataFrame") -> dict[tuple[str, str], AlphaBeta]:
    """Alpha-beta constants per ``(framework, kind)``, least squares of relative error over every
    stored size (``t = alpha * ring steps + bytes sent per rank / beta``).

    Raises:
        ValueError: naming the framework and kind whose times do not grow with size.
    """
    fits = {}
    for (framework, kind), g in table.groupby(["framework", "kind"], sort=True):
        try:
            fits[(framework, kind)] = fit_alpha_beta(g.rank_bytes.to_numpy(), g.time_s.to_numpy(), g.num_steps.to_numpy(),
                                                     relative=True)
        except ValueError as err:
            raise ValueError(f"{framework} {kind}: {err} (too few or too noisy sizes: measure larger messages)") from None
    return fits

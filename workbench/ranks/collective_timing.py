"""One rank of the collective benchmark (:mod:`workbench.launch.benchmark`): times all-reduce,
all-gather and reduce-scatter over message sizes on MLX or JAX, and returns plain numbers."""

from __future__ import annotations

import os
import time


def _iters_for(size_bytes: int, iters: int) -> int:
    """More repetitions for small messages (noise), never fewer than ``iters``."""
    return max(iters, min(50, (1 << 22) // size_bytes))


def _bench_mlx(spec: dict) -> dict:
    import mlx.core as mx

    from workbench.adapters.mlx.ring import init_ring
    from workbench.adapters.mlx.transport import gather_bucket, reduce_scatter_bucket, resolve_transport

    group = init_ring(os.environ.get("WORKBENCH_BACKEND", "ring"))
    n = group.size()
    rs_path = resolve_transport(group, "auto")  # the path fsdp_apply_gradients takes by default
    barrier = mx.zeros((1,))
    # ranks start together (an all_sum of one element), once per size or before each call: the spec's barrier
    # (workbench.launch.benchmark.benchmark_spec; a spec stored before it had one: each call)
    each_call = spec.get("barrier", "each call") == "each call"
    out = {}
    for kind in spec["kinds"]:
        for size in spec["sizes_bytes"]:
            elems = size // 4
            x = mx.ones((elems if kind != "all_gather" else elems // n,), dtype=mx.float32)
            mx.eval(x)

            def op():
                if kind == "all_reduce":
                    return mx.distributed.all_sum(x, group=group)
                if kind == "all_gather":  # as the steps gather (in pieces where the launch says)
                    return gather_bucket(x, group, None)
                c = elems // n  # the FSDP step's bucket reduce-scatter (the exchange in pieces where gathers are)
                return reduce_scatter_bucket(x[:n * c].reshape(n, c), group, rs_path, None)

            times = []
            for i in range(_iters_for(size, spec["iters"]) + 2):
                if each_call or i == 0:
                    mx.eval(mx.distributed.all_sum(barrier, group=group))
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

    from workbench.adapters.jax.distributed import devices_by_process
    from workbench.adapters.jax.step_base import smap

    mesh = Mesh(devices_by_process(), ("x",))
    bodies = {
        "all_reduce": lambda a: jax.lax.psum(a, "x"),
        "all_gather": lambda a: jax.lax.all_gather(a, "x", tiled=True),
        "reduce_scatter": lambda a: jax.lax.psum_scatter(a, "x", tiled=True),
    }
    out = {}
    for kind in spec["kinds"]:
        fn = smap(bodies[kind], mesh, P("x"), P("x"), True)
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
    from workbench.ranks.probes import package_versions

    result = _bench_mlx(spec) if spec["framework"] == "mlx" else _bench_jax(spec)
    return {**result, "versions": package_versions()}

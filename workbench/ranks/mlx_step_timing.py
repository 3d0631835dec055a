"""One rank of the MLX step-time benchmark (driven by ``benchmarks/bench_fsdp_step.py``).

    python -m workbench.ranks.mlx_step_timing --out DIR [--hidden 2048] [--layers 6] [--steps 12]
        [--strategies ddp,fsdp-row,fsdp-flat] [--phases] [--communication-size BYTES ...]
        [--link-sizes BYTES ...]

The model is the MLP of :mod:`workbench.models.mlx_mlp`, ``--layers`` square ``--hidden`` layers.
Every strategy keeps its own parameters and optimizer; each step runs every strategy once,
in turn (interleaved, so drift in machine load hits them alike). A step is timed from the
gradient computation to the evaluated new parameters, behind a barrier so ranks start
together. With several ``--communication-size`` values each (strategy, size) pair is one
entry, named ``strategy@bytes``. FSDP keeps its state resident (:class:`ResidentFsdp`); ``fsdp-row-apply``
and ``fsdp-flat-apply`` run the stateless ``fsdp_apply_gradients``. ``--phases`` adds, per FSDP layout
(resident) and for DDP, a step cut
into its parts with an evaluation between each (``phases_s``: gradient, bucket rows,
reduce-scatter (DDP: the all-reduce), update, all-gather, rebuild): slower than the real step,
but it says where the time goes.
``--link-sizes`` first times all-gather and reduce-scatter alone at those sizes
(:func:`workbench.ranks.collective_timing.bench_rank`), for the bucket-size advisor's links.
Writes ``DIR/rank{r}.json`` with per-step times and optimizer-state bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from workbench.adapters.mlx.fsdp import (
    ddp_apply_gradients,
    fsdp_apply_gradients,
    optimizer_state_bytes,
)
from workbench.adapters.mlx.resident import ResidentFsdp
from workbench.adapters.mlx.ring import init_ring
from workbench.adapters.mlx.rows import (
    bucket_matrix,
    bucket_row,
    get_plan,
    rebuild_arrays,
)
from workbench.adapters.mlx.transport import (
    gather_bucket,
    reduce_scatter_bucket,
    resolve_transport,
)
from workbench.core.units import MiB
from workbench.models.mlx_mlp import build_params, mlp_loss
from workbench.ranks.collective_timing import bench_rank
from workbench.strategies import LAYOUTS, get_strategy

#: What each timed name runs: a registered strategy (:mod:`workbench.strategies`) and, for MLX's FSDP step,
#: its reduce-scatter transport and whether its state stays resident (:class:`ResidentFsdp`, issue 30) or
#: the stateless ``fsdp_apply_gradients`` runs (``-apply``: the parameter rows cut again every step).
STRATEGIES = {
    "ddp": ("ddp", None, False),
    "fsdp-row": ("fsdp-row", "auto", True),
    "fsdp-flat": ("fsdp-flat", "auto", True),
    "fsdp-row-apply": ("fsdp-row", "auto", False),
    "fsdp-flat-apply": ("fsdp-flat", "auto", False),
    "fsdp-row-sendrecv": ("fsdp-row", "send_recv", False),
    "fsdp-flat-sendrecv": ("fsdp-flat", "send_recv", False),
    "fsdp-row-allsum": ("fsdp-row", "all_sum", False),
    "fsdp-flat-allsum": ("fsdp-flat", "all_sum", False),
}
DEFAULT_STRATEGIES = ("ddp", "fsdp-row", "fsdp-flat")
PHASES = ("grad", "rows", "reduce_scatter", "update", "all_gather", "rebuild")


def phased_step(params, opt, grad_fn, x, y, layout: str, communication_size: int, group, barrier,
                resident: ResidentFsdp | None = None) -> tuple[dict, dict]:
    """One FSDP step (no clipping) cut into :data:`PHASES`, each evaluated and timed on its own.

    Returns ``(new params, {phase: seconds})``. The parts are the real step's functions
    (:func:`~workbench.adapters.mlx.rows.bucket_matrix`, the reduce-scatter transport ``"auto"``
    resolves to, the optimizer, :func:`~workbench.adapters.mlx.transport.all_gather`,
    :func:`~workbench.adapters.mlx.rows.rebuild_arrays`). With ``resident`` the optimizer updates its
    master shards (as :meth:`ResidentFsdp.step`), else the rows it cuts from ``params`` (as
    ``fsdp_apply_gradients``).
    """
    n, rank = group.size(), group.rank()
    times = {}

    def timed(name, fn):
        mx.eval(mx.distributed.all_sum(barrier, group=group))
        t0 = time.perf_counter()
        out = fn()
        mx.eval(out)
        times[name] = times.get(name, 0.0) + time.perf_counter() - t0
        return out

    _, grads = timed("grad", lambda: grad_fn(params, x, y))
    flat = tree_flatten(params)
    arrays, gl = [a for _, a in flat], [g for _, g in tree_flatten(grads)]
    plan = get_plan(flat, communication_size, n, layout)
    num_b = plan.buckets.num_buckets
    transport = resolve_transport(group, "auto")
    mats = timed("rows", lambda: [bucket_matrix(gl, plan, b) for b in range(num_b)])
    shards = timed("reduce_scatter", lambda: {str(b): reduce_scatter_bucket(mats[b], group, transport, None) / n
                                              for b in range(num_b)})
    new = timed("update", lambda: opt.apply_gradients(shards, resident.shards if resident is not None else
                                                      {str(b): bucket_row(arrays, plan, rank, b) for b in range(num_b)}))
    if resident is not None:
        resident.shards.update(new)
    gathered = timed("all_gather", lambda: [gather_bucket(new[str(b)], group, None) for b in range(num_b)])
    rebuilt = timed("rebuild", lambda: [rebuild_arrays(gathered[b], arrays, plan, b) for b in range(num_b)])
    updated = list(flat)
    for b in range(num_b):
        for i, a in zip(plan.buckets.bucket(b).tolist(), rebuilt[b]):
            updated[i] = (flat[i][0], a)
    return tree_unflatten(updated), times


def ddp_phased_step(params, opt, grad_fn, x, y, communication_size: int, group, barrier) -> tuple[dict, dict]:
    """DDP's step (``mlx.nn.average_gradients``, then the update) cut into the same parts as
    :func:`phased_step`: gradient, bucket rows (the concatenated bucket), the all-reduce (and the
    division), the update; the all-gather and rebuild parts are zero."""
    n = group.size()
    times = dict.fromkeys(PHASES, 0.0)

    def timed(name, fn):
        mx.eval(mx.distributed.all_sum(barrier, group=group))
        t0 = time.perf_counter()
        out = fn()
        mx.eval(out)
        times[name] += time.perf_counter() - t0
        return out

    _, grads = timed("grad", lambda: grad_fn(params, x, y))
    flat = tree_flatten(grads)
    buckets = get_plan(tree_flatten(params), communication_size, n, "flat").buckets
    idx = [buckets.bucket(b).tolist() for b in range(buckets.num_buckets)]
    cat = timed("rows", lambda: [mx.concatenate([flat[i][1].reshape(-1) for i in ix]) for ix in idx])
    summed = timed("reduce_scatter", lambda: [mx.distributed.all_sum(c, group=group) / n for c in cat])
    avg = []
    for ix, s in zip(idx, summed):
        offsets = np.cumsum([0] + [flat[i][1].size for i in ix])
        avg += [(flat[i][0], s[offsets[j]:offsets[j + 1]].reshape(flat[i][1].shape)) for j, i in enumerate(ix)]
    new = timed("update", lambda: opt.apply_gradients(tree_unflatten(avg), params))
    return new, times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES),
                        help=f"comma-separated, from {', '.join(STRATEGIES)}")
    parser.add_argument("--communication-size", type=int, nargs="+", default=[32 * MiB])
    parser.add_argument("--phases", action="store_true", help="also time each FSDP layout's step part by part")
    parser.add_argument("--link-sizes", type=int, nargs="*", default=[],
                        help="first time all-gather and reduce-scatter at these sizes (bytes), as the collective "
                             "benchmark does, for an alpha-beta fit")
    args = parser.parse_args()
    names = args.strategies.split(",")
    unknown = [s for s in names if s not in STRATEGIES]
    if unknown:
        raise SystemExit(f"unknown strategies {unknown}; choose from {', '.join(STRATEGIES)}")
    group = init_ring(os.environ.get("WORKBENCH_BACKEND", "ring"))
    rank, size = group.rank(), group.size()
    link_times = {}
    if args.link_sizes:
        link_times = bench_rank({"framework": "mlx", "kinds": ["all_gather", "reduce_scatter"],
                                 "sizes_bytes": args.link_sizes, "iters": 5})["times_s"]
    sizes = args.communication_size
    entries = {(f"{s}@{c}" if len(sizes) > 1 else s): (s, c) for c in sizes for s in names}
    records = {s: get_strategy(STRATEGIES[s][0], framework="mlx") for s in names}
    # The phase tables: one per layout timed, and DDP's (keyed by its name; it has no layout).
    layouts = sorted({r.layout or r.name for r in records.values()}) if args.phases else []
    dims = (args.hidden,) * (args.layers + 1)
    params = {name: build_params(dims, seed=3, dtype=mx.float32) for name in [*entries, *(f"phases-{lay}" for lay in layouts)]}
    opts = {name: optim.AdamW(learning_rate=1e-4) for name in params}
    grad_fn = mx.value_and_grad(mlp_loss)
    rng = np.random.default_rng(rank)
    x = mx.array(rng.normal(size=(args.batch // size, args.hidden)).astype(np.float32))
    y = mx.array(rng.normal(size=(args.batch // size, args.hidden)).astype(np.float32))
    times = {name: [] for name in entries}
    rank_checks = {}  # the ranks' plan check of fsdp_apply_gradients: seconds, first step of each plan only
    phases = {lay: {p: [] for p in PHASES} for lay in layouts}
    barrier = mx.zeros((1,))
    residents = {name: ResidentFsdp(params[name], opts[name], group, comm_size, records[strategy].layout,
                                    reduce_scatter=STRATEGIES[strategy][1])
                 for name, (strategy, comm_size) in entries.items() if STRATEGIES[strategy][2]}
    rank_checks.update({name: r.rank_check_s for name, r in residents.items() if r.rank_check_s is not None})
    residents.update({f"phases-{lay}": ResidentFsdp(params[f"phases-{lay}"], opts[f"phases-{lay}"], group, sizes[0], lay)
                      for lay in layouts if lay in LAYOUTS})
    for _ in range(args.steps):
        for name, (strategy, comm_size) in entries.items():
            record, transport = records[strategy], STRATEGIES[strategy][1]
            mx.eval(mx.distributed.all_sum(barrier))
            t0 = time.perf_counter()
            _, g = grad_fn(params[name], x, y)
            if record.family == "data_parallel":
                params[name] = ddp_apply_gradients(g, params[name], opts[name], communication_size=comm_size)
            elif name in residents:  # the state in the buckets' layout for the run
                params[name] = residents[name].step(g)
            else:
                report: dict = {}
                params[name] = fsdp_apply_gradients(g, params[name], opts[name], communication_size=comm_size,
                                                    report=report, layout=record.layout, reduce_scatter=transport)
                if report["rank_check_s"] is not None:
                    rank_checks[name] = report["rank_check_s"]
            mx.eval(params[name], opts[name].state)
            times[name].append(time.perf_counter() - t0)
        for lay in layouts:
            key = f"phases-{lay}"
            if lay not in LAYOUTS:  # DDP's
                params[key], parts = ddp_phased_step(params[key], opts[key], grad_fn, x, y, sizes[0], group, barrier)
            else:
                params[key], parts = phased_step(params[key], opts[key], grad_fn, x, y, lay, sizes[0], group, barrier,
                                                 residents[key])
            for p, t in parts.items():
                phases[lay][p].append(t)
    num_params = sum(v.size for _, v in tree_flatten(params[next(iter(entries))]))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{rank}.json").write_text(json.dumps({
        "rank": rank, "size": size, "num_params": num_params, "times_s": times, "phases_s": phases,
        "communication_sizes": sizes, "link_times_s": link_times, "reduce_scatter_transport": resolve_transport(group, "auto"),
        "optimizer_state_bytes": {name: optimizer_state_bytes(opts[name]) for name in entries},
        "rank_check_s": rank_checks,
        "peak_memory_bytes": mx.get_peak_memory(),
    }))


if __name__ == "__main__":
    main()

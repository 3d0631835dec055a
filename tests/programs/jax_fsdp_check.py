"""One process of a real multi-process JAX run on CPU: DDP and FSDP on a global mesh, results as JSON.

Usage: through the launcher, which sets each rank's ``WORKBENCH_COORDINATOR``,
``WORKBENCH_NUM_PROCESSES``, ``WORKBENCH_PROCESS_ID``, ``WORKBENCH_BACKEND`` and the JAX
CPU flags (:func:`workbench.launch.plan.plan_launch`; ``{process_id}`` in ``--out`` becomes the
rank)::

    run_local(plan_launch(2, framework="jax", env=programs.rank_env()),
              ["-m", "programs.jax_fsdp_check", "--out", "run_{process_id}.json"])

or by hand, one command per process (process 0 hosts the coordinator); a flag given
overrides its environment variable::

    XLA_FLAGS=--xla_force_host_platform_device_count=1 JAX_PLATFORMS=cpu PYTHONPATH=tests \\
    python -m programs.jax_fsdp_check --coordinator 127.0.0.1:PORT --num-processes 2 \\
        --process-id I --out run_I.json [--steps 3] [--seed 0] [--communication-size 256]

Each process owns one CPU device; cross-process collectives go through gloo. Every
process builds the same small MLP and global batch from a NumPy seed
(:func:`workbench.models.jax_mlp.build_problem`), runs every configuration of :data:`CONFIGS`
for ``--steps`` steps, and writes plain data (no live arrays)::

    {"process_id": I, "num_processes": P, "num_devices": D, "num_local_devices": 1,
     "gloo_bound_to": "127.0.0.1" (or null if JAX moved the hook, see workbench.adapters.jax.distributed.bind_gloo_to),
     "results": {name: {"params": {path: nested list}, "losses": [...], "grad_norms": [...],
                        "num_collectives": int, "num_buckets": int, "wall_s": float}}}
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from workbench.adapters.jax.distributed import initialize_jax
from workbench.models.jax_mlp import build_problem, mlp_loss
from workbench.ranks.jax_args import parse_rank_args

#: Configurations run by every process: (kind, layout, optimizer, max_norm).
CONFIGS: dict[str, tuple[str, str | None, str, float | None]] = {
    "ddp-sgd": ("ddp", None, "sgd", None),
    "ddp-adamw": ("ddp", None, "adamw", 0.5),
    "fsdp-row-sgd": ("fsdp", "row", "sgd", None),
    "fsdp-row-adamw": ("fsdp", "row", "adamw", 0.5),
    "fsdp-flat-sgd": ("fsdp", "flat", "sgd", None),
    "fsdp-flat-adamw": ("fsdp", "flat", "adamw", 0.5),
    "fsdp-row-rs-adamw": ("fsdp", "row", "adamw", 0.5),
    "fsdp-flat-rs-sgd": ("fsdp", "flat", "sgd", None),
}

#: Configurations whose reduce-scatter is XLA's ``psum_scatter`` (the others: the step's default, ``"auto"``:
#: the all-to-all one on these CPU devices).
PSUM_SCATTER = ("fsdp-row-rs-adamw", "fsdp-flat-rs-sgd")


def make_optimizer(name: str):
    """``"sgd"`` (lr 0.1) or ``"adamw"`` (lr 1e-2, weight decay 1e-2): the optimizers of :data:`CONFIGS`."""
    from workbench.adapters.jax.base import make_optimizer as make_jax_optimizer

    return make_jax_optimizer(name, 0.1) if name == "sgd" else make_jax_optimizer(name, 1e-2, weight_decay=1e-2)


def run_configs(mesh, params: dict, batch: tuple, *, steps: int, communication_size: int) -> dict:
    """Run every configuration of :data:`CONFIGS` on ``mesh`` (1-D, axis ``"fsdp"``); plain-data results."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from workbench.adapters.jax.base import spec_from_jax
    from workbench.adapters.jax.fsdp import make_ddp_step, make_fsdp_step

    def to_global(tree, spec):
        sharding = NamedSharding(mesh, spec)  # every process holds the full NumPy data: take our pieces
        return jax.tree_util.tree_map(lambda a: jax.make_array_from_callback(a.shape, sharding, lambda idx: a[idx]), tree)

    def to_host(a):  # a replicated global array: this process's copy
        return np.asarray(a.addressable_data(0))

    paths = spec_from_jax(params).paths
    results = {}
    for name, (kind, layout, opt, max_norm) in CONFIGS.items():
        start = time.perf_counter()
        if kind == "ddp":
            step = make_ddp_step(mlp_loss, params, make_optimizer(opt), mesh, max_norm=max_norm)
            num_buckets = len(paths)
        else:
            step = make_fsdp_step(mlp_loss, params, make_optimizer(opt), mesh, layout=layout, max_norm=max_norm,
                                  communication_size=communication_size,
                                  reduce_scatter="psum_scatter" if name in PSUM_SCATTER else "auto")
            num_buckets = step.plan.buckets.num_buckets
        p = to_global(params, P())
        b = to_global(batch, P("fsdp"))
        state = step.init(p)
        losses, norms = [], []
        for _ in range(steps):
            p, state, metrics = step.step(p, state, b)
            losses.append(float(to_host(metrics["loss"])))
            norms.append(float(to_host(metrics["grad_norm"])))
        leaves = [to_host(a) for a in jax.tree_util.tree_leaves(p)]
        results[name] = {
            "params": {path: leaf.tolist() for path, leaf in zip(paths, leaves)},
            "losses": losses,
            "grad_norms": norms,
            "num_collectives": int(metrics["num_collectives"]),
            "num_buckets": int(num_buckets),
            "wall_s": time.perf_counter() - start,
        }
    return results


def parse_args(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> argparse.Namespace:
    """This program's arguments: ``--steps``, ``--seed``, ``--communication-size`` (FSDP bucket cap in
    bytes) and a rank's (:func:`workbench.ranks.jax_args.parse_rank_args`: each absent flag of the world
    is read from the launcher's variable in ``environ``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--communication-size", type=int, default=256, help="FSDP bucket cap in bytes")
    return parse_rank_args(argv, environ, parser=parser)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)

    import jax
    from jax.sharding import Mesh

    host = args.coordinator.rsplit(":", 1)[0]
    gloo_bound = initialize_jax(args.coordinator, args.num_processes, args.process_id,
                                backend=args.backend, timeout_s=args.timeout_s)
    try:
        mesh = Mesh(np.array(jax.devices()), ("fsdp",))  # global: every process's devices, by process
        params, batch = build_problem(args.seed)
        results = run_configs(mesh, params, batch, steps=args.steps, communication_size=args.communication_size)
        record = {"process_id": jax.process_index(), "num_processes": jax.process_count(),
                  "num_devices": jax.device_count(), "num_local_devices": jax.local_device_count(),
                  "gloo_bound_to": host if gloo_bound else None,
                  "results": results}
        tmp = f"{args.out}.tmp"
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, args.out)
    finally:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main()

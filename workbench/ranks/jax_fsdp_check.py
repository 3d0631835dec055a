"""One process of a real multi-process JAX run on CPU: DDP and FSDP on a global mesh, results as JSON.

Usage: through the launcher, which sets each rank's ``WORKBENCH_COORDINATOR``,
``WORKBENCH_NUM_PROCESSES``, ``WORKBENCH_PROCESS_ID``, ``WORKBENCH_BACKEND`` and the JAX
CPU flags (:func:`workbench.launch.plan.plan_launch`; ``{process_id}`` in ``--out`` becomes the
rank)::

    run_local(plan_launch(2, framework="jax"),
              ["-m", "workbench.ranks.jax_fsdp_check", "--out", "run_{process_id}.json"])

or by hand, one command per process (process 0 hosts the coordinator); a flag given
overrides its environment variable::

    XLA_FLAGS=--xla_force_host_platform_device_count=1 JAX_PLATFORMS=cpu \\
    python -m workbench.ranks.jax_fsdp_check --coordinator 127.0.0.1:PORT --num-processes 2 \\
        --process-id I --out run_I.json [--steps 3] [--seed 0] [--communication-size 256]

Each process owns one CPU device; cross-process collectives go through gloo. Every
process builds the same small MLP and global batch from a NumPy seed
(:func:`build_problem`), runs every configuration of :data:`CONFIGS` for ``--steps``
steps, and writes plain data (no live arrays)::

    {"process_id": I, "num_processes": P, "num_devices": D, "num_local_devices": 1,
     "gloo_bound_to": "127.0.0.1" (or null if JAX moved the hook, see bind_gloo_to),
     "results": {name: {"params": {path: nested list}, "losses": [...], "grad_norms": [...],
                        "num_collectives": int, "num_buckets": int, "wall_s": float}}}
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import numpy as np

from workbench.adapters.jax.distributed import BACKENDS, bind_gloo_to, initialize_jax  # noqa: F401 (bind_gloo_to: the tests')

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


def build_problem(seed: int = 0, batch_size: int = 16, dims: tuple[int, ...] = (8, 16, 4)) -> tuple[dict, tuple]:
    """A deterministic MLP and global batch, as float32 NumPy arrays.

    Returns:
        ``(params, (x, y))``: ``params["l{i}"] = {"w": (d_i, d_{i+1}), "b": (d_{i+1},)}``,
        x of shape (batch_size, dims[0]), y of shape (batch_size, dims[-1]).
    """
    rng = np.random.default_rng(seed)
    params = {
        f"l{i}": {"w": (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32),
                  "b": (0.1 * rng.standard_normal(b)).astype(np.float32)}
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:]))
    }
    x = rng.standard_normal((batch_size, dims[0])).astype(np.float32)
    y = rng.standard_normal((batch_size, dims[-1])).astype(np.float32)
    return params, (x, y)


def mlp_loss(params: Any, batch: Any) -> Any:
    """Mean squared error of a tanh MLP (``params`` as :func:`build_problem`), a scalar."""
    import jax.numpy as jnp

    x, y = batch
    h = x
    for i in range(len(params)):
        h = h @ params[f"l{i}"]["w"] + params[f"l{i}"]["b"]
        if i < len(params) - 1:
            h = jnp.tanh(h)
    return jnp.mean((h - y) ** 2)


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


#: Flag -> the environment variable (set by :func:`workbench.launch.plan.plan_launch`) read when it is absent.
ENV = {"coordinator": "WORKBENCH_COORDINATOR", "num_processes": "WORKBENCH_NUM_PROCESSES",
       "process_id": "WORKBENCH_PROCESS_ID", "backend": "WORKBENCH_BACKEND"}


def parse_args(argv: list[str] | None = None, environ: dict[str, str] | None = None, *,
               parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """The worker's arguments; each flag of :data:`ENV` that is absent is read from its variable.

    ``parser`` (another JAX worker's, with its own flags added) gets this worker's flags too.

    ``--backend`` defaults to ``gloo``; ``{process_id}`` in ``--out`` becomes the process id.
    Exits with status 2 (``argparse``'s), naming the flag and the variable, when neither is
    given or the variable's value is malformed.
    """
    environ = os.environ if environ is None else environ
    own = parser is None
    parser = parser or argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--coordinator", help="host:port of process 0's coordinator, e.g. 127.0.0.1:1234")
    parser.add_argument("--num-processes", type=int)
    parser.add_argument("--process-id", type=int)
    parser.add_argument("--backend", choices=BACKENDS, help="CPU collectives (default: gloo)")
    parser.add_argument("--out", required=True, help="JSON file to write; '{process_id}' is replaced by the rank")
    if own:
        parser.add_argument("--steps", type=int, default=3)
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--communication-size", type=int, default=256, help="FSDP bucket cap in bytes")
    parser.add_argument("--timeout-s", type=int, default=60, help="distributed initialisation timeout")
    args = parser.parse_args(argv)
    for name, var in ENV.items():
        flag, value = "--" + name.replace("_", "-"), environ.get(var) or ("gloo" if name == "backend" else "")
        if getattr(args, name) is not None:
            continue
        if not value:
            parser.error(f"{flag} is required when {var} is not set.")
        if name in ("num_processes", "process_id") and not value.isdigit():
            parser.error(f"{flag} is not given and {var}={value!r} is not a non-negative integer.")
        if name == "backend" and value not in BACKENDS:
            parser.error(f"{flag} is not given and {var}={value!r} is not one of {BACKENDS}.")
        setattr(args, name, int(value) if name in ("num_processes", "process_id") else value)
    args.out = args.out.replace("{process_id}", str(args.process_id))
    return args


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

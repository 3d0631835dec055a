"""One rank of the MLX step-time benchmark (driven by ``benchmarks/bench_fsdp_step.py``).

    python -m workbench.ranks.mlx_step_timing --out DIR [--hidden 2048] [--layers 6] [--steps 12]

Every strategy keeps its own parameters and optimizer; each step runs every strategy once,
in turn (interleaved, so drift in machine load hits them alike). A step is timed from the
gradient computation to the evaluated new parameters, behind a barrier so ranks start
together. Writes ``DIR/rank{r}.json`` with per-step times and optimizer-state bytes.
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
from mlx.utils import tree_flatten

from workbench.adapters.mlx.fsdp import ddp_apply_gradients, fsdp_apply_gradients, optimizer_state_bytes
from workbench.core.units import MiB
from workbench.ranks.mlx_fsdp_check import build_params, mlp_loss

STRATEGIES = {
    "ddp": None,
    "fsdp-row": dict(layout="row", reduce_scatter="ring"),
    "fsdp-flat": dict(layout="flat", reduce_scatter="ring"),
    "fsdp-row-sendrecv": dict(layout="row", reduce_scatter="send_recv"),
    "fsdp-flat-sendrecv": dict(layout="flat", reduce_scatter="send_recv"),
    "fsdp-row-allsum": dict(layout="row", reduce_scatter="all_sum"),
    "fsdp-flat-allsum": dict(layout="flat", reduce_scatter="all_sum"),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--communication-size", type=int, default=32 * MiB)
    args = parser.parse_args()
    group = mx.distributed.init(backend=os.environ.get("WORKBENCH_BACKEND", "ring"), strict=True)
    rank, size = group.rank(), group.size()
    dims = (args.hidden,) * (args.layers + 1)
    params = {name: build_params(dims, seed=3, dtype=mx.float32) for name in STRATEGIES}
    opts = {name: optim.AdamW(learning_rate=1e-4) for name in STRATEGIES}
    grad_fn = mx.value_and_grad(mlp_loss)
    rng = np.random.default_rng(rank)
    x = mx.array(rng.normal(size=(args.batch // size, args.hidden)).astype(np.float32))
    y = mx.array(rng.normal(size=(args.batch // size, args.hidden)).astype(np.float32))
    times = {name: [] for name in STRATEGIES}
    barrier = mx.zeros((1,))
    for _ in range(args.steps):
        for name, kw in STRATEGIES.items():
            mx.eval(mx.distributed.all_sum(barrier))
            t0 = time.perf_counter()
            _, g = grad_fn(params[name], x, y)
            if kw is None:
                params[name] = ddp_apply_gradients(g, params[name], opts[name], communication_size=args.communication_size)
            else:
                params[name] = fsdp_apply_gradients(g, params[name], opts[name], communication_size=args.communication_size, **kw)
            mx.eval(params[name], opts[name].state)
            times[name].append(time.perf_counter() - t0)
    num_params = sum(v.size for _, v in tree_flatten(params["ddp"]))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{rank}.json").write_text(json.dumps({
        "rank": rank, "size": size, "num_params": num_params, "times_s": times,
        "optimizer_state_bytes": {name: optimizer_state_bytes(o) for name, o in opts.items()},
        "peak_memory_bytes": mx.get_peak_memory(),
    }))


if __name__ == "__main__":
    main()

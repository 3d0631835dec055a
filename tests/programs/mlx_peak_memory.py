"""One rank of MLX's own ``test_fsdp_peak_memory`` (mlx v0.32.0, ``python/tests/nccl_test_distributed.py``),
ported to the workbench's step on any backend (started by tests/test_mlx_peak_memory.py through
:func:`workbench.launch.local_run.run_worker`).

    PYTHONPATH=tests python -m programs.mlx_peak_memory --out DIR [--layouts row,flat]

The body is MLX's, line for line: two parameters ``(N * 1024, 1024)`` and ``(N * 2048, 512)`` and
random gradients (seed 42), Adam at 0.01; ten DDP steps (``average_gradients``, ``clip_grad_norm`` at
1.0, the update), then ten FSDP steps (``fsdp_apply_gradients(..., max_norm=1.0)``) from the
parameters DDP left, each phase's peak after ``reset_peak_memory``. The DDP optimizer stays alive
through the FSDP phase, as in MLX's test. MLX asserts ``fsdp_peak_memory < ddp_peak_memory``; this
writes both to ``DIR/rank{r}.json`` for the test to compare. Each layout of ``--layouts`` has an FSDP phase
of its own after the one DDP phase, from the parameters DDP left (kept in NumPy meanwhile, outside MLX's
memory) and a fresh optimizer: MLX's test once per layout, one launch and one DDP phase for all.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import mlx.core as mx
import numpy as np
import mlx.optimizers as optim
from mlx.nn.utils import average_gradients

from workbench.adapters.mlx.fsdp import fsdp_apply_gradients


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--layouts", default="row", help="comma-separated: row, flat")
    args = parser.parse_args()
    layouts = args.layouts.split(",")
    if not layouts or set(layouts) - {"row", "flat"}:
        parser.error(f"--layouts {args.layouts!r}: row, flat or both, comma-separated")
    world = mx.distributed.init(backend=os.environ.get("WORKBENCH_BACKEND", "ring"), strict=True)
    N = world.size()  # MLX's name
    mx.random.seed(42)
    params = {"w1": mx.random.normal((N * 1024, 1024)), "w2": mx.random.normal((N * 2048, 512))}
    grads = {"w1": mx.random.normal((N * 1024, 1024)), "w2": mx.random.normal((N * 2048, 512))}
    mx.eval(params, grads)
    optimizer_ddp = optim.Adam(learning_rate=0.01)

    def pseudo_step_ddp(grads, params, optimizer):
        grads = average_gradients(grads)
        grads, grad_norm = optim.clip_grad_norm(grads, max_norm=1.0)
        params = optimizer.apply_gradients(grads, params)
        return grad_norm, params

    def pseudo_step_fsdp(grads, params, optimizer, layout):
        params, grad_norm = fsdp_apply_gradients(grads, params, optimizer, max_norm=1.0, layout=layout)
        return grad_norm, params

    mx.reset_peak_memory()
    for _ in range(10):
        grad_norm, params = pseudo_step_ddp(grads, params, optimizer_ddp)
        mx.eval(grad_norm, params)
    ddp_peak_memory = mx.get_peak_memory()
    left = {name: np.array(p) for name, p in params.items()}  # what DDP left, outside MLX's memory
    del params
    fsdp_peak_memory = {}
    for layout in layouts:
        params = {name: mx.array(p) for name, p in left.items()}
        optimizer_fsdp = optim.Adam(learning_rate=0.01)
        mx.eval(params)
        mx.reset_peak_memory()
        for _ in range(10):
            grad_norm, params = pseudo_step_fsdp(grads, params, optimizer_fsdp, layout)
            mx.eval(grad_norm, params)
        fsdp_peak_memory[layout] = mx.get_peak_memory()
        del params, optimizer_fsdp, grad_norm
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{world.rank()}.json").write_text(json.dumps({
        "rank": world.rank(), "size": N, "ddp_peak_memory": ddp_peak_memory, "fsdp_peak_memory": fsdp_peak_memory}))


if __name__ == "__main__":
    main()

"""One rank of a real MLX run that holds :class:`~workbench.adapters.mlx.resident.ResidentFsdp` to
``fsdp_apply_gradients`` (started by tests/test_resident_mlx.py through ``run_worker``).

    PYTHONPATH=tests python -m programs.resident_mlx_check --out DIR [--steps 3]

Per case (layout row/flat, clipping off/on, fp32 AdamW; the "odd" model's flat buckets are padded), the same
MLP from the same seed takes ``--steps`` steps three ways: the resident step, ``fsdp_apply_gradients`` and DDP.
Row, no clipping, also runs MLX v0.32.0's own algorithm (``programs.mlx_fsdp_check``). Writes
``DIR/rank{r}.json`` with the parameters as lists, the norms, and the optimizer state's keys and sizes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from programs.mlx_fsdp_check import MODELS, batch, make_optimizer, mlx_v0320_fsdp_apply_gradients, tolist
from workbench.adapters.mlx.fsdp import ddp_apply_gradients, fsdp_apply_gradients
from workbench.adapters.mlx.resident import ResidentFsdp
from workbench.models.mlx_mlp import build_params, mlp_loss

CASES = [dict(model="even", layout="row", max_norm=None), dict(model="even", layout="flat", max_norm=0.5),
         dict(model="odd", layout="flat", max_norm=None), dict(model="even", layout="row", max_norm=0.5)]


def run(case: dict, way: str, group, steps: int) -> dict:
    dims, opt = MODELS[case["model"]], make_optimizer("adamw")
    params, norms = build_params(dims, seed=7, dtype=mx.float32), []
    kw = dict(communication_size=256, max_norm=case["max_norm"])
    resident = ResidentFsdp(params, opt, group, layout=case["layout"], **kw) if way == "resident" else None
    for step in range(steps):
        x, y = batch(step, dims, group.rank(), group.size(), mx.float32)
        _, grads = mx.value_and_grad(mlp_loss)(params, x, y)
        if way == "resident":
            out = resident.step(grads)
        elif way == "fsdp":
            out = fsdp_apply_gradients(grads, params, opt, group, layout=case["layout"], **kw)
        elif way == "ddp":
            out = ddp_apply_gradients(grads, params, opt, group, **kw)
        else:
            out = mlx_v0320_fsdp_apply_gradients(grads, params, opt, group, communication_size=256)
        params, norm = out if case["max_norm"] is not None else (out, None)
        mx.eval(params, opt.state)
        norms.append(None if norm is None else norm.item())
    state = {k: v.size for k, v in tree_flatten(opt.state) if isinstance(v, mx.array) and v.ndim == 1}
    return {"params": tolist(params), "norms": norms, "state_sizes": state,
            "shards": {k: v.size for k, v in resident.shards.items()} if resident else None}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    group = mx.distributed.init(backend="ring", strict=True)
    results = []
    for case in CASES:
        ways = ["resident", "fsdp", "ddp"] + (["mlx_v0320"] if case["layout"] == "row" and case["max_norm"] is None else [])
        results.append({"case": case, **{way: run(case, way, group, args.steps) for way in ways}})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{group.rank()}.json").write_text(json.dumps({"rank": group.rank(), "results": results}))


if __name__ == "__main__":
    main()

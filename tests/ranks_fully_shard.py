"""One rank of a real run of MLX's own ``fully_shard`` through the workbench's shim (started by
tests/test_fully_shard.py through :func:`workbench.launch.local_run.run_local`).

    python tests/ranks_fully_shard.py --out DIR [--parts scope,fidelity,zero3,memory,unguarded | stuck]

Parts:

* ``scope``: the pre-run check without the shim, then inside it; what the shim changes and restores;
* ``fidelity``: ``fully_shard`` (each block, then the root, the user's loop style) under
  :func:`supply_sum_scatter` against DDP (``nn.average_gradients``), several steps, on the built-in LM
  (with ``clip_grad_norm_sharded`` against ``clip_grad_norm``; fp32 and bf16) and on
  ``examples.tiny_mlp_lm`` (units named by the user); collectives counted by a spy; and the
  :class:`FullyShardTrainer` (2 micro-batches) against the same DDP;
* ``zero3``: the workbench's ZeRO-3 gradients against ``fully_shard``'s, one step;
* ``readiness``: the readiness check's refusals against what MLX itself raises (or lets through and fails on);
* ``memory``: peak bytes of one step (after a warm-up step) per strategy on a larger LM;
* ``unguarded``: ``fully_shard`` without shim and without check, one step (last: it fails mid-step);
* ``stuck``: rank 0 probes inside the shim while rank 1 never joins (the probe cannot return).

Each rank writes ``DIR/rank{r}.json`` (plain lists and numbers).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.nn.layers.distributed as mlx_distributed
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

from workbench.adapters.mlx import transport
from workbench.adapters.mlx.base import spec_from_mlx
from workbench.adapters.mlx.fully_shard import (
    SumScatterMissing,
    check_sum_scatter,
    full_parameters,
    fully_shard_units,
    supply_sum_scatter,
    unwrap_path,
)
from workbench.adapters.mlx.fully_shard_trainer import FullyShardTrainer
from workbench.adapters.mlx.zero3 import shard_model
from workbench.core.fully_shard_plan import plan_fully_shard
from workbench.core.paths import REPO_ROOT
from workbench.models.init import LMConfig
from workbench.models.mlx_lm import lm_loss

from programs.mlx_fsdp_check import Spy  # this script's folder, tests/, is sys.path[0]
from programs.mlx_zero3_check import LARGE, SMALL, batch, build, peak_of_step

sys.path.append(str(REPO_ROOT))
from examples import tiny_mlp_lm  # noqa: E402

STEPS = 2
MLP_UNITS = ["fc1", "fc2"]


def flat(tree) -> dict:
    return {k: np.array(v.astype(mx.float32)).reshape(-1).tolist() for k, v in tree_flatten(tree)}


def mlp_batch(step: int, rank: int, size: int, global_batch: int = 8, seq: int = 8):
    tokens = np.random.default_rng(200 + step).integers(0, tiny_mlp_lm.VOCAB_SIZE, (global_batch, seq + 1))
    local = tokens[rank * global_batch // size:(rank + 1) * global_batch // size]
    return mx.array(local[:, :-1]), mx.array(local[:, 1:])


def part_scope(group) -> dict:
    out = {}
    t = time.monotonic()
    try:
        out["check_without_shim"] = check_sum_scatter(group, timeout_s=60)
    except SumScatterMissing as err:
        out["check_without_shim"] = str(err)
        out["check_backend"] = err.backend
    out["check_s"] = time.monotonic() - t
    original = mx.distributed.sum_scatter
    with supply_sum_scatter(group) as supply:
        out["inside"] = {"module_mx_is_core": mlx_distributed.mx is mx,
                         "core_sum_scatter_unchanged": mx.distributed.sum_scatter is original,
                         "check": check_sum_scatter(group, timeout_s=60)}
        try:  # the backend's own sum_scatter, called directly, still says what it is
            mx.eval(mx.distributed.sum_scatter(mx.zeros((group.size(),)), group=group))
            out["inside"]["direct_call"] = "ran"
        except RuntimeError as err:
            out["inside"]["direct_call"] = str(err)
    out["supply"] = {"supplied": supply.supplied, "transport": supply.transport, "backend": supply.backend}
    out["after"] = {"module_mx_is_core": mlx_distributed.mx is mx, "has_sum_scatter": transport.has_sum_scatter(group)}
    try:
        with supply_sum_scatter(group):
            raise KeyError("boom")
    except KeyError:
        out["after_error_module_mx_is_core"] = mlx_distributed.mx is mx
    return out


def run_ddp(model, loss_fn, batches, group, opt, max_norm=None) -> dict:
    res = {"losses": [], "norms": []}
    vg = nn.value_and_grad(model, loss_fn)
    for step, (x, y) in enumerate(batches):
        loss, grads = vg(model, x, y)
        grads = nn.average_gradients(grads, group=group)
        if max_norm is not None:
            grads, norm = optim.clip_grad_norm(grads, max_norm)
            res["norms"].append(norm.item())
        if step == 0:
            res["grads"] = flat(grads)
        opt.update(model, grads)
        mx.eval(model.parameters(), opt.state, loss)
        res["losses"].append(loss.item())
    res["params"] = flat(model.parameters())
    return res


def run_fully_shard(model, loss_fn, batches, group, opt, spy, max_norm=None) -> dict:
    res = {"losses": [], "norms": [], "counts": [], "num_supplied": []}
    spy.take()
    with supply_sum_scatter(group) as supply:
        vg = nn.value_and_grad(model, loss_fn)
        for step, (x, y) in enumerate(batches):
            before = supply.num_calls
            loss, grads = vg(model, x, y)
            if max_norm is not None:
                grads, norm = nn.utils.clip_grad_norm_sharded(grads, max_norm, group=group)
                res["norms"].append(norm.item())
            res["counts"].append(spy.take())  # forward, backward and clipping (collectives are built here)
            if step == 0:  # this rank's rows, gathered to compare with DDP's whole gradients
                res["grads"] = flat({unwrap_path(model, k)[0]: mx.distributed.all_gather(g, group=group)
                                     for k, g in tree_flatten(grads)})
                spy.take()
            opt.update(model, grads)
            mx.eval(model.parameters(), opt.state, loss)
            res["num_supplied"].append(supply.num_calls - before)
            res["losses"].append(loss.item())
        res["supplied"] = supply.supplied
    res["params"] = flat(full_parameters(model, group))
    res["state_elems"] = sum(v.size for _, v in tree_flatten(opt.state) if v.ndim)
    spy.take()
    return res


def part_fidelity(group, spy) -> dict:
    r, n = group.rank(), group.size()
    lm_batches = [batch(SMALL, s, r, n) for s in range(STEPS)]
    out = {}
    for dtype in ("float32", "bfloat16"):
        cast = (lambda m: m.set_dtype(mx.bfloat16) or m) if dtype == "bfloat16" else (lambda m: m)
        ddp = run_ddp(cast(build(SMALL)), lm_loss, lm_batches, group, optim.SGD(0.5), max_norm=1.0)
        model = fully_shard_units(cast(build(SMALL)), group)
        fs = run_fully_shard(model, lm_loss, lm_batches, group, optim.SGD(0.5), spy, max_norm=1.0)
        out[f"lm_{dtype}"] = {"ddp": ddp, "fully_shard": fs}
    trainer = FullyShardTrainer(build(SMALL), optim.SGD(0.5), group, max_norm=1.0, num_microbatches=2)
    res = {"losses": [], "norms": [], "counts": []}
    spy.take()
    for x, y in lm_batches:  # against lm_float32's DDP: 2 micro-batches of the same batches
        loss, norm = trainer.step(lm_loss, x, y)
        res["counts"].append(spy.take())  # the step's collectives, micro-batches, clipping and update
        res["losses"].append(loss.item())
        res["norms"].append(norm.item())
    out["trainer"] = {**res, "report": trainer.report, "params": flat(trainer.full_parameters())}
    adam = lambda: optim.AdamW(1e-2, weight_decay=0.01)  # noqa: E731
    out["lm_adamw"] = {"ddp": run_ddp(build(SMALL), lm_loss, lm_batches, group, adam()),
                       "fully_shard": run_fully_shard(fully_shard_units(build(SMALL), group), lm_loss, lm_batches,
                                                      group, adam(), spy)}
    mlp_batches = [mlp_batch(s, r, n) for s in range(STEPS)]
    model, loss_fn = tiny_mlp_lm.mlx_factory(seed=1)
    ddp = run_ddp(model, loss_fn, mlp_batches, group, optim.SGD(0.5))
    model, loss_fn = tiny_mlp_lm.mlx_factory(seed=1)
    out["plan_mlp"] = plan_fully_shard(spec_from_mlx(model), n, units=MLP_UNITS).summary()
    fs = run_fully_shard(fully_shard_units(model, group, units=MLP_UNITS), loss_fn, mlp_batches, group,
                         optim.SGD(0.5), spy)
    out["user_factory"] = {"ddp": ddp, "fully_shard": fs}
    out["plan_lm"] = plan_fully_shard(spec_from_mlx(build(SMALL)), n).summary()
    return out


def part_zero3(group) -> dict:
    """One step's gradients: the workbench's ZeRO-3 (ring reduce-scatter) against fully_shard (shim), blocks + root."""
    x, y = batch(SMALL, 0, group.rank(), group.size())
    theirs = fully_shard_units(build(SMALL), group)
    with supply_sum_scatter(group):
        _, g_theirs = nn.value_and_grad(theirs, lm_loss)(theirs, x, y)
        mx.eval(g_theirs)
    ours = shard_model(build(SMALL), group, reshard_after_forward=False)
    _, g_ours = nn.value_and_grad(ours, lm_loss)(ours, x, y)
    mx.eval(g_ours)
    # Both hold row r of each parameter (ZeRO-3 as 1-D rows, fully_shard along axis 0): compare flattened.
    t = {unwrap_path(theirs, k)[0]: v.reshape(-1) for k, v in tree_flatten(g_theirs)}
    o = {k.replace("model.", "", 1).replace(".module.", ".").replace("module.", ""): v
         for k, v in tree_flatten(g_ours)}
    return {"theirs": flat(t), "ours": flat(o)}


def part_readiness(group) -> dict:
    odd = LMConfig(vocab_size=32, seq_len=8, dim=5, num_layers=1, num_heads=1, mlp_dim=8)
    model, out = build(odd), {}
    try:
        fully_shard_units(model, group)
    except ValueError as err:
        out["listed"] = str(err)
    out["untouched"] = not any(isinstance(m, mlx_distributed.FullyShardedModule) for _, m in model.named_modules())
    try:
        nn.fully_shard(build(odd).layers[0], group=group)
    except ValueError as err:
        out["mlx_block"] = str(err)
    quantized = nn.Sequential(nn.Linear(64, 64).to_quantized(group_size=32, bits=4))
    try:
        fully_shard_units(quantized, group)
    except ValueError as err:
        out["listed_quantized"] = str(err)
    try:  # MLX wraps it, then its forward fails
        mx.eval(nn.fully_shard(quantized, group=group)(mx.ones((2, 64))))
        out["mlx_quantized"] = None
    except ValueError as err:
        out["mlx_quantized"] = str(err)
    return out


def part_memory(group) -> dict:
    rank, size = group.rank(), group.size()

    def ddp():
        model, opt = build(LARGE), optim.AdamW(1e-2)
        vg = nn.value_and_grad(model, lm_loss)

        def step(i):
            loss, grads = vg(model, *batch(LARGE, i, rank, size))
            opt.update(model, nn.average_gradients(grads, group=group))
            mx.eval(model.parameters(), opt.state, loss)
        return step, None

    def fs(compute_dtype=None):
        model, opt = fully_shard_units(build(LARGE), group, compute_dtype=compute_dtype), optim.AdamW(1e-2)
        vg = nn.value_and_grad(model, lm_loss)

        def step(i):
            loss, grads = vg(model, *batch(LARGE, i, rank, size))
            opt.update(model, grads)
            mx.eval(model.parameters(), opt.state, loss)
        return step, None

    out = {}
    with supply_sum_scatter(group):
        for name, make in (("ddp", ddp), ("fully_shard", fs), ("fully_shard_bf16", lambda: fs(mx.bfloat16))):
            gc.collect()
            out[name] = peak_of_step(make)
    spec = spec_from_mlx(build(LARGE))
    out["plan"] = plan_fully_shard(spec, size).summary()
    out["plan_bf16"] = plan_fully_shard(spec, size, compute_dtype="bfloat16").summary()
    return out


def part_unguarded(group) -> dict:
    model = fully_shard_units(build(SMALL), group)
    t = time.monotonic()
    try:
        loss, grads = nn.value_and_grad(model, lm_loss)(model, *batch(SMALL, 0, group.rank(), group.size()))
        mx.eval(loss, grads)
        return {"error": None, "s": time.monotonic() - t}
    except RuntimeError as err:
        return {"error": str(err), "s": time.monotonic() - t}


def part_stuck(group) -> None:
    if group.rank() == 0:
        with supply_sum_scatter(group):
            check_sum_scatter(group, timeout_s=3)  # rank 1 never joins the probe's exchange: ends the process
    time.sleep(60)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--parts", default="scope,fidelity,zero3,readiness,memory,unguarded")
    args = parser.parse_args()
    backend = os.environ.get("WORKBENCH_BACKEND", "ring")
    group = mx.distributed.init(backend=backend, strict=True)
    parts = args.parts.split(",")
    if "stuck" in parts:
        part_stuck(group)
    transport.has_sum_scatter(group)  # the once-per-process probe, before the spy counts
    spy = Spy()
    out = {"rank": group.rank(), "size": group.size(), "backend": backend}
    for name, fn in (("scope", part_scope), ("fidelity", lambda g: part_fidelity(g, spy)), ("zero3", part_zero3),
                     ("readiness", part_readiness), ("memory", part_memory), ("unguarded", part_unguarded)):
        if name in parts:
            t = time.monotonic()
            out[name] = fn(group)
            out[f"{name}_s"] = time.monotonic() - t
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{group.rank()}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main()

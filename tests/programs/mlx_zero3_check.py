"""One rank of a real MLX run proving full sharding and gradient accumulation (started by
tests/test_mlx_zero3.py through :func:`workbench.launch.local_run.run_worker`).

    PYTHONPATH=tests python -m programs.mlx_zero3_check --out DIR [--parts equal,accum,memory,errors,fully_shard]

Every rank builds the same small LM (:mod:`workbench.models`) from a NumPy seed and takes its
slice of each global batch. Parts:

* ``equal``: ZeRO-3 (:func:`~workbench.adapters.mlx.zero3_trainer.make_zero3_trainer`, both
  ``reshard_after_forward`` modes) against DDP for several AdamW steps;
* ``accum``: DDP, FSDP and ZeRO-3 with G micro-batches, deferred and per-micro-batch sync,
  against one large-batch DDP step; collectives counted by the :class:`programs.mlx_fsdp_check.Spy`;
* ``memory``: MLX peak memory of one step per strategy (a larger LM), after a warm-up step;
* ``errors``: the messages of refused unit choices and unshardable parameters;
* ``fully_shard``: MLX's ``fully_shard`` against ours; on ring and MPI through
  :func:`~workbench.adapters.mlx.fully_shard.supply_sum_scatter`, which supplies the missing ``sum_scatter``.

It writes ``DIR/rank{r}.json`` (plain lists and numbers); the tests compare.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from workbench.adapters.mlx.accum import make_trainer
from workbench.adapters.mlx.base import make_optimizer as make_mlx_optimizer
from workbench.adapters.mlx.fsdp import ddp_apply_gradients, fsdp_apply_gradients
from workbench.adapters.mlx.fully_shard import supply_sum_scatter
from workbench.adapters.mlx.transport import has_sum_scatter
from workbench.adapters.mlx.zero3 import shard_model
from workbench.adapters.mlx.zero3_trainer import make_zero3_trainer
from workbench.models.init import LMConfig, init_lm_params
from workbench.models.mlx_lm import MLXLM, lm_loss, load_params

from programs.mlx_fsdp_check import Spy

SMALL = LMConfig(vocab_size=32, seq_len=8, dim=16, num_layers=2, num_heads=2, mlp_dim=32)
LARGE = LMConfig(vocab_size=256, seq_len=16, dim=128, num_layers=8, num_heads=4, mlp_dim=512)
GLOBAL_BATCH = 8  # sequences per step, split over the ranks
NUM_MICROBATCHES = 2
CUSTOM_UNITS = ["layers.0.attn", "layers.0", "layers.1.mlp"]  # nested, and a unit inside a plain block
FSDP_BUCKET_BYTES = 2**18  # FSDP buckets in the memory cases: small next to the model (12 MiB)


def build(cfg: LMConfig) -> MLXLM:
    return load_params(MLXLM(cfg), init_lm_params(cfg, seed=3))


def batch(cfg: LMConfig, step: int, rank: int, size: int, global_batch: int = GLOBAL_BATCH):
    """This rank's (inputs, targets) of the global batch of ``step``."""
    tokens = np.random.default_rng(100 + step).integers(0, cfg.vocab_size, (global_batch, cfg.seq_len + 1))
    per = global_batch // size
    local = tokens[rank * per:(rank + 1) * per]
    return mx.array(local[:, :-1]), mx.array(local[:, 1:])


def adamw():
    return make_mlx_optimizer("adamw", 1e-2, weight_decay=0.01, bias_correction=False)


def sgd():
    """SGD for the accumulation cases: parameters move linearly with the gradient, so they compare tightly."""
    return make_mlx_optimizer("sgd", 0.5)


def tolist(params: dict) -> dict:
    return {k: np.array(v.astype(mx.float32)).reshape(-1).tolist() for k, v in params.items()}


def run_trainer(trainer, cfg, group, spy, steps: int, full_params) -> dict:
    out = {"losses": [], "norms": [], "counts": [], "reports": []}
    spy.take()
    for step in range(steps):
        loss, norm = trainer.step(lm_loss, *batch(cfg, step, group.rank(), group.size()))
        out["counts"].append(spy.take())
        out["reports"].append(trainer.report)
        out["losses"].append(loss.item())
        out["norms"].append(None if norm is None else norm.item())
    out["params"] = tolist(full_params())
    spy.take()
    return out


def part_equal(group, spy, steps: int = 3) -> dict:
    ddp = make_trainer(build(SMALL), adamw(), group, strategy="ddp", max_norm=1.0)
    out = {"ddp": run_trainer(ddp, SMALL, group, spy, steps, lambda: dict(tree_flatten(ddp.model.parameters())))}
    for reshard in (True, False):
        z = make_zero3_trainer(build(SMALL), adamw(), group, reshard_after_forward=reshard, max_norm=1.0)
        res = run_trainer(z, SMALL, group, spy, steps, z.full_parameters)
        res["units"] = z.model.unit_num_params()
        res["state_elems"] = sum(v.size for _, v in tree_flatten(z.optimizer.state) if v.ndim)
        res["ddp_state_elems"] = sum(v.size for _, v in tree_flatten(ddp.optimizer.state) if v.ndim)
        out[f"zero3_reshard_{reshard}"] = res
    z = make_zero3_trainer(build(SMALL), adamw(), group, units=CUSTOM_UNITS, max_norm=1.0)
    out["zero3_custom_units"] = run_trainer(z, SMALL, group, spy, steps, z.full_parameters)
    out["zero3_custom_units"]["units"] = z.model.unit_num_params()
    return out


def part_accum(group, spy, steps: int = 2) -> dict:
    g = NUM_MICROBATCHES
    big = make_trainer(build(SMALL), sgd(), group, strategy="ddp")
    out = {"large_batch": run_trainer(big, SMALL, group, spy, steps,
                                      lambda: dict(tree_flatten(big.model.parameters())))}
    for strategy in ("ddp", "fsdp", "full"):
        for defer in (True, False):
            if strategy == "full":
                t = make_zero3_trainer(build(SMALL), sgd(), group, num_microbatches=g, defer_sync=defer)
                full = t.full_parameters
            else:
                t = make_trainer(build(SMALL), sgd(), group, strategy=strategy, num_microbatches=g, defer_sync=defer,
                                 communication_size=2048)
                full = (lambda t=t: dict(tree_flatten(t.model.parameters())))
            out[f"{strategy}_defer_{defer}"] = run_trainer(t, SMALL, group, spy, steps, full)
    return out


def peak_of_step(make) -> dict:
    """Peak bytes of a step after a warm-up step (which creates the optimizer state), the bytes
    held at rest before it, and per phase (``accumulated`` / ``updated``) for trainers."""
    step, trainer = make()
    step(0)
    gc.collect()
    mx.clear_cache()
    mx.reset_peak_memory()
    out = {"rest_bytes": int(mx.get_active_memory())}

    def hook(phase):
        out[f"{phase}_peak_bytes"] = int(mx.get_peak_memory())
        out[f"{phase}_active_bytes"] = int(mx.get_active_memory())
        mx.reset_peak_memory()

    if trainer is not None:
        trainer.phase_hook = hook
    step(1)
    out["peak_bytes"] = max([int(mx.get_peak_memory())] + [v for k, v in out.items() if k.endswith("_peak_bytes")])
    return out


def part_memory(group) -> dict:
    rank, size = group.rank(), group.size()

    def plain(strategy):  # the loop of workbench.ranks.train_mlx.train_mlx
        model, opt = build(LARGE), adamw()
        value_and_grad = nn.value_and_grad(model, lm_loss)

        def step(i):
            loss, grads = value_and_grad(model, *batch(LARGE, i, rank, size))
            params = model.trainable_parameters()
            if strategy == "ddp":
                model.update(ddp_apply_gradients(grads, params, opt, group))
            else:
                model.update(fsdp_apply_gradients(grads, params, opt, group, communication_size=FSDP_BUCKET_BYTES))
            mx.eval(model.parameters(), opt.state, loss)
        return step, None

    def trainer(make, **kw):  # G micro-batches of the plain steps' batch each
        t = make(build(LARGE), adamw(), group, **kw)
        global_batch = GLOBAL_BATCH * kw.get("num_microbatches", 1)
        return (lambda i: t.step(lm_loss, *batch(LARGE, i, rank, size, global_batch))), t

    cases = {"ddp": lambda: plain("ddp"), "fsdp": lambda: plain("fsdp")}
    for reshard in (True, False):
        cases[f"zero3_reshard_{reshard}"] = lambda r=reshard: trainer(make_zero3_trainer, reshard_after_forward=r)
    for defer in (True, False):
        kw = dict(num_microbatches=NUM_MICROBATCHES, defer_sync=defer)
        cases[f"accum_fsdp_defer_{defer}"] = lambda kw=kw: trainer(make_trainer, strategy="fsdp",
                                                                   communication_size=FSDP_BUCKET_BYTES, **kw)
        cases[f"accum_full_defer_{defer}"] = lambda kw=kw: trainer(make_zero3_trainer, **kw)
    out = {}
    for name, make in cases.items():
        gc.collect()
        out[name] = peak_of_step(make)
    out["units"] = shard_model(build(LARGE), group).unit_num_params()
    return out


def part_errors(group) -> dict:
    out = {}
    cases = {
        "missing_unit": dict(units=["layers.0", "layers.7"]),
        "parameter_as_unit": dict(units=["embed.weight"]),
        "duplicate_unit": dict(units=["layers.0", "layers.0"]),
        "bad_reshard": dict(reshard_after_forward="yes"),
    }
    for name, kw in cases.items():
        try:
            shard_model(build(SMALL), group, **kw)
            out[name] = None
        except ValueError as err:
            out[name] = str(err)
    odd = LMConfig(vocab_size=32, seq_len=8, dim=5, num_layers=1, num_heads=1, mlp_dim=8)
    try:
        shard_model(build(odd), group)
        out["indivisible"] = None
    except ValueError as err:
        out["indivisible"] = str(err)
    try:
        trainer = make_zero3_trainer(build(SMALL), adamw(), group, num_microbatches=3)
        trainer.step(lm_loss, *batch(SMALL, 0, group.rank(), group.size()))
        out["microbatches"] = None
    except ValueError as err:
        out["microbatches"] = str(err)
    return out


def part_fully_shard(group, spy) -> dict:
    """MLX's ``fully_shard`` against :func:`shard_model` (gradients of one step). Where the backend has no
    ``sum_scatter`` (ring, MPI), the shim supplies the workbench ring for the backward graph's build."""
    from mlx.nn.layers.distributed import fully_shard

    cfg = LMConfig(vocab_size=32, seq_len=8, dim=16, num_layers=2, num_heads=2, mlp_dim=32)
    theirs = build(cfg)
    for i, layer in enumerate(theirs.layers):
        theirs.layers[i] = fully_shard(layer, group=group)
    ours = shard_model(build(cfg), group, units=[f"layers.{i}" for i in range(cfg.num_layers)])
    x, y = batch(cfg, 0, group.rank(), group.size())
    with supply_sum_scatter(group) as supply:
        _, g_theirs = nn.value_and_grad(theirs, lm_loss)(theirs, x, y)
        mx.eval(g_theirs)
    _, g_ours = nn.value_and_grad(ours, lm_loss)(ours, x, y)
    # The blocks only: fully_shard leaves the root's gradients local (not averaged).
    flat_t = {k.replace(".module.", "."): v for k, v in tree_flatten(g_theirs) if k.startswith("layers.")}
    flat_o = {k.replace("model.module.", "").replace(".module.", "."): v for k, v in tree_flatten(g_ours)}
    flat_o = {k: v for k, v in flat_o.items() if k.startswith("layers.")}
    return {"supplied": supply.supplied, "num_supplied": supply.num_calls,
            "grads_theirs": tolist({k: v.reshape(-1) for k, v in flat_t.items()}),
            "grads_ours": tolist({k: v.reshape(-1) for k, v in flat_o.items()})}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--parts", default="equal,accum,memory,errors,fully_shard")
    args = parser.parse_args()
    backend = os.environ.get("WORKBENCH_BACKEND", "ring")
    group = mx.distributed.init(backend=backend, strict=True)
    has_sum_scatter(group)  # the once-per-process probe, before the spy counts
    spy = Spy()
    parts = args.parts.split(",")
    out = {"rank": group.rank(), "size": group.size(), "backend": backend}
    if "errors" in parts:
        out["errors"] = part_errors(group)
    if "fully_shard" in parts:
        out["fully_shard"] = part_fully_shard(group, spy)
    if "equal" in parts:
        out["equal"] = part_equal(group, spy)
    if "accum" in parts:
        out["accum"] = part_accum(group, spy)
    if "memory" in parts:
        out["memory"] = part_memory(group)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{group.rank()}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main()

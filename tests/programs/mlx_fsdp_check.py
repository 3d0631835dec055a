"""One rank of a real MLX run that proves FSDP equals DDP (started by tests/test_mlx_fsdp.py and
tests/test_mlx_hsdp_mpi.py through :func:`workbench.launch.local_run.run_worker`).

    PYTHONPATH=tests python -m programs.mlx_fsdp_check --out DIR [--steps 3] [--cases all|quick] [--hsdp K]

Every rank builds the same small MLP (:mod:`workbench.models.mlx_mlp`) from a NumPy seed, takes its slice of one global batch
per step, and runs DDP (``mlx.nn.average_gradients`` + the optimizer) and FSDP
(:func:`~workbench.adapters.mlx.fsdp.fsdp_apply_gradients`) side by side for each case.
It records parameters, gradient norms, its gradient shards next to the DDP-averaged
gradient's slices, optimizer-state bytes, and the collectives actually called (a spy on
``mx.distributed``). It writes ``DIR/rank{r}.json``; the tests compare. Arrays travel as
plain lists: engines and workers return data, never live arrays.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
from collections import Counter
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from workbench.adapters.mlx.base import make_optimizer as make_mlx_optimizer
from workbench.adapters.mlx.fsdp import (
    ddp_apply_gradients,
    fsdp_apply_gradients,
    optimizer_state_bytes,
    shard_gradients,
)
from workbench.adapters.mlx.rows import get_plan
from workbench.adapters.mlx.transport import (gather_bucket, gather_lazy, has_sum_scatter, make_hsdp_groups,
                                              reduce_scatter_bucket, ring_reduce_scatter)
from workbench.core.envvars import RING_PIECE_BYTES, RING_PIECE_ENV, scoped_env
from workbench.models.mlx_mlp import build_params, mlp_loss

DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16}
MODELS = {"even": (8, 16, 16, 4), "odd": (6, 10, 3)}  # "odd" has arrays whose size does not divide 4
GLOBAL_BATCH = 16


def batch(step: int, dims: tuple[int, ...], rank: int, size: int, dtype):
    """This rank's slice of the global batch of ``step``."""
    rng = np.random.default_rng(1000 + step)
    x = rng.normal(size=(GLOBAL_BATCH, dims[0])).astype(np.float32)
    y = rng.normal(size=(GLOBAL_BATCH, dims[-1])).astype(np.float32)
    per = GLOBAL_BATCH // size
    sl = slice(rank * per, (rank + 1) * per)
    return mx.array(x[sl]).astype(dtype), mx.array(y[sl])


def make_optimizer(name: str):
    """The optimizers of the cases: SGD at lr 0.1, or AdamW at lr 0.01 with weight decay 0.01 (MLX's default,
    no bias correction)."""
    if name == "sgd":
        return make_mlx_optimizer("sgd", 0.1)
    return make_mlx_optimizer("adamw", 0.01, weight_decay=0.01, bias_correction=False)


class Spy:
    """Counts calls of the ``mx.distributed`` collectives (a real spy: the step calls through it)."""

    NAMES = ("all_sum", "all_gather", "sum_scatter", "send", "recv", "recv_like")

    def __init__(self) -> None:
        self.counts: Counter = Counter()
        self._orig = {name: getattr(mx.distributed, name) for name in self.NAMES}
        for name, fn in self._orig.items():
            setattr(mx.distributed, name, self._wrap(name, fn))

    def _wrap(self, name, fn):
        def wrapped(*args, **kwargs):
            self.counts[name] += 1
            return fn(*args, **kwargs)
        return wrapped

    def take(self) -> dict:
        out = dict(self.counts)
        self.counts.clear()
        return out


def tolist(tree) -> dict:
    return {k: np.array(v.astype(mx.float32)).reshape(-1).tolist() for k, v in tree_flatten(tree)}


def run_case(case: dict, group, spy: Spy, steps: int, fsdp_group=None, dp_group=None) -> dict:
    """DDP over ``group`` against FSDP over ``fsdp_group`` (default ``group``), HSDP with ``dp_group``."""
    dims = MODELS[case["model"]]
    dtype = DTYPES[case["dtype"]]
    rank, size = group.rank(), group.size()
    fsdp = fsdp_group or group
    hsdp = {"fsdp_group": fsdp, "dp_group": dp_group}
    out = {"case": case, "ddp_norms": [], "fsdp_norms": [], "counts": [], "reports": []}
    try:
        p_ddp = p_fsdp = build_params(dims, seed=7, dtype=dtype)
        o_ddp, o_fsdp = make_optimizer(case["optimizer"]), make_optimizer(case["optimizer"])
        grad_fn = mx.value_and_grad(mlp_loss)
        for step in range(steps):
            x, y = batch(step, dims, rank, size, dtype)
            _, g_ddp = grad_fn(p_ddp, x, y)
            _, g_fsdp = grad_fn(p_fsdp, x, y)
            if step == 0:  # this rank's gradient shard against its slice of the DDP average
                plan = get_plan(tree_flatten(p_fsdp), case["communication_size"], fsdp.size(), case["layout"])
                shards = shard_gradients(tree_flatten(g_fsdp), plan, fsdp, dp_group, transport=case["reduce_scatter"])
                avg = dict(tree_flatten(nn.average_gradients(g_ddp, group=group)))
                mine = [s for b in range(plan.buckets.num_buckets) for s in plan.rank_slices(fsdp.rank(), b)]
                want = [np.array(avg[s.path].astype(mx.float32)).reshape(-1)[s.start:s.stop] for s in mine]
                got = []
                for b in range(plan.buckets.num_buckets):
                    real = sum(s.stop - s.start for s in plan.rank_slices(fsdp.rank(), b))
                    got.append(np.array(shards[str(b)].astype(mx.float32))[:real])
                out["shard_got"] = np.concatenate(got).tolist()
                out["shard_want"] = np.concatenate(want).tolist()
                spy.take()
            norm_kw = {"max_norm": case["max_norm"]} if case["max_norm"] is not None else {}
            res = ddp_apply_gradients(g_ddp, p_ddp, o_ddp, group=group, communication_size=case["communication_size"], **norm_kw)
            p_ddp, n_ddp = res if norm_kw else (res, None)
            mx.eval(p_ddp)
            spy.take()
            report: dict = {}
            res = fsdp_apply_gradients(g_fsdp, p_fsdp, o_fsdp, communication_size=case["communication_size"],
                                       layout=case["layout"], reduce_scatter=case["reduce_scatter"], report=report,
                                       **hsdp, **norm_kw)
            p_fsdp, n_fsdp = res if norm_kw else (res, None)
            mx.eval(p_fsdp)
            out["counts"].append(spy.take())
            out["reports"].append(report)
            out["ddp_norms"].append(None if n_ddp is None else n_ddp.item())
            out["fsdp_norms"].append(None if n_fsdp is None else n_fsdp.item())
        out["ddp_params"], out["fsdp_params"] = tolist(p_ddp), tolist(p_fsdp)
        out["dtypes"] = sorted({str(v.dtype) for _, v in tree_flatten(p_fsdp)})
        out["ddp_state_bytes"], out["fsdp_state_bytes"] = optimizer_state_bytes(o_ddp), optimizer_state_bytes(o_fsdp)
    except ValueError as err:  # a refused plan: recorded, and every rank refuses alike
        out["error"] = str(err)
    return out


def mlx_v0320_fsdp_apply_gradients(gradients, parameters, optimizer, group, communication_size: int):
    """MLX v0.32.0's ``fsdp_apply_gradients`` (``python/mlx/nn/utils.py``, no clipping, no ``dp_group``),
    line for line but one change: the ring backend has no ``sum_scatter``, so ``all_sum`` and row ``r``
    stand in for it (at 2 ranks every element is ``a + b`` either way). Groups come from the bucket
    plan, which follows MLX's ``_group_by_size`` rule."""
    from mlx.utils import tree_unflatten

    s, rank = group.size(), group.rank()
    flat_grads, flat_params = tree_flatten(gradients), tree_flatten(parameters)
    buckets = get_plan(flat_params, communication_size, s, "row").buckets
    groups = [buckets.bucket(b).tolist() for b in range(buckets.num_buckets)]
    grad_slices, param_slices = {}, {}
    for group_idx, arr_group in enumerate(groups):
        big_grad = mx.concatenate([flat_grads[i][1].reshape(s, -1) for i in arr_group], axis=1)
        grad_slices[group_idx] = mx.distributed.all_sum(big_grad, group=group)[rank:rank + 1] / s
        big_param = mx.concatenate([flat_params[i][1].reshape(s, -1) for i in arr_group], axis=1)
        param_slices[group_idx] = big_param[rank]
    updated_param_slices = optimizer.apply_gradients(grad_slices, param_slices)
    new_flat = []
    for group_idx, arr_group in enumerate(groups):
        big_gathered = mx.distributed.all_gather(updated_param_slices[group_idx], group=group)
        split_indices = list(itertools.accumulate(flat_grads[i][1].size // s for i in arr_group))
        parts = mx.split(big_gathered, split_indices[:-1], axis=1)
        for idx_in_group, i in enumerate(arr_group):
            new_flat.append((flat_grads[i][0], parts[idx_in_group].reshape(flat_grads[i][1].shape)))
    return tree_unflatten(new_flat)


def bit_identity_case(group, steps: int) -> dict:
    """The workbench's step (row layout, ``"auto"`` reduce-scatter) against MLX v0.32.0's, fp32 AdamW:
    the parameters after ``steps`` steps, as lists, for the test to compare exactly."""
    dims, out = MODELS["even"], {}
    for name in ("workbench", "mlx_v0320"):
        params, opt = build_params(dims, seed=7, dtype=mx.float32), make_optimizer("adamw")
        for step in range(steps):
            x, y = batch(step, dims, group.rank(), group.size(), mx.float32)
            _, grads = mx.value_and_grad(mlp_loss)(params, x, y)
            if name == "workbench":
                params = fsdp_apply_gradients(grads, params, opt, communication_size=256)
            else:
                params = mlx_v0320_fsdp_apply_gradients(grads, params, opt, group, communication_size=256)
            mx.eval(params)
        out[name] = tolist(params)
    return out


def pieces_case(group, spy: Spy) -> dict:
    """A shard over the size MLX's ring splits over two sockets (800,012 B: 3 whole pieces and a part), all-gathered
    in pieces as a launch on too few cores asks (:data:`RING_PIECE_ENV`) and in MLX's one call, and the reduce-scatter
    (at 2 ranks one exchange of a row) of a matrix of such rows, each way: equal bit for bit, and the calls counted."""
    r, n, c = group.rank(), group.size(), 200_003
    shard = mx.random.normal((c,), key=mx.random.key(r))
    matrix = mx.random.normal((n, c), key=mx.random.key(100 + r))
    mx.eval(shard, matrix)
    out = {}
    for name, piece in (("one call", "0"), ("pieces", str(RING_PIECE_BYTES))):
        with scoped_env(**{RING_PIECE_ENV: piece}):
            spy.take()
            gathered = gather_bucket(shard, group, None)
            calls = spy.take()
            summed = reduce_scatter_bucket(matrix, group, "ring", None)
            rs_calls = spy.take()
            # lazy, as MLX's fully_shard gathers a unit ((1, c): its parameters concatenated) and the supplied
            # reduce-scatter and ZeRO-3's collectives build their graphs
            lazy = gather_lazy(shard.reshape(1, -1), group)
            lazy_rs = ring_reduce_scatter(lambda k: matrix[k], group)
            mx.eval(lazy, lazy_rs)
            lazy_calls = spy.take()
        out[name] = {"gathered": np.array(gathered).tolist(), "calls": calls, "summed": np.array(summed).tolist(),
                     "rs_calls": rs_calls, "lazy_gathered": np.array(lazy).tolist(),
                     "lazy_summed": np.array(lazy_rs).tolist(), "lazy_calls": lazy_calls}
    out["own"] = np.array(shard).tolist()
    return out


def cases(which: str) -> list[dict]:
    grid = itertools.product(["sgd", "adamw"], ["float32", "bfloat16"], ["row", "flat"], [None, 0.5])
    out = [dict(model="even", optimizer=o, dtype=d, layout=l, max_norm=m, communication_size=256, reduce_scatter="auto")
           for o, d, l, m in grid]
    out += [
        dict(model="even", optimizer="adamw", dtype="float32", layout="flat", max_norm=None, communication_size=256, reduce_scatter="all_sum"),
        dict(model="even", optimizer="adamw", dtype="bfloat16", layout="row", max_norm=0.5, communication_size=256, reduce_scatter="send_recv"),
        dict(model="even", optimizer="sgd", dtype="float32", layout="row", max_norm=None, communication_size=0, reduce_scatter="auto"),
        dict(model="odd", optimizer="adamw", dtype="float32", layout="flat", max_norm=0.5, communication_size=64, reduce_scatter="auto"),
        dict(model="odd", optimizer="sgd", dtype="float32", layout="row", max_norm=None, communication_size=64, reduce_scatter="auto"),
    ]
    return out[-4:] + out[:2] if which == "quick" else out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--cases", default="all", choices=["all", "quick"])
    parser.add_argument("--hsdp", type=int, default=0, help="shard over blocks of this many ranks, replicate across blocks")
    args = parser.parse_args()
    backend = os.environ.get("WORKBENCH_BACKEND", "ring")
    group = mx.distributed.init(backend=backend, strict=True)
    sum_scatter = has_sum_scatter(group)  # the once-per-process probe, before the spy counts
    try:
        fsdp_group, dp_group = make_hsdp_groups(args.hsdp or 1, group)
        hsdp = "split ok"
    except RuntimeError as err:
        fsdp_group = dp_group = None
        hsdp = str(err)
    if not args.hsdp:
        fsdp_group = dp_group = None
    spy = Spy()
    results = [run_case(case, group, spy, args.steps, fsdp_group, dp_group) for case in cases(args.cases)]
    bit_identity = bit_identity_case(group, args.steps)
    pieces = pieces_case(group, spy) if backend == "ring" else None  # the ring's socket threads alone split a gather
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{group.rank()}.json").write_text(
        json.dumps({"rank": group.rank(), "size": group.size(), "results": results, "hsdp": hsdp, "bit_identity": bit_identity,
                    "pieces": pieces,
                    "sum_scatter_supported": sum_scatter, "backend": backend}))
    # Free split groups now: left to interpreter exit, MLX frees their MPI communicators after
    # MPI_Finalize ("MPI_Comm_free() was called after MPI_FINALIZE") and the rank aborts.
    del fsdp_group, dp_group, group, results
    gc.collect()


if __name__ == "__main__":
    main()

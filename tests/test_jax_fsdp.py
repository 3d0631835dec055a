"""JAX FSDP, HSDP and ZeRO-3 steps realise the core's plan and equal the DDP reference.

Single process, 8 emulated CPU devices (``conftest.py``). Tolerances, per dtype: float32
``rtol=1e-6`` with ``atol = 1e-6 * max|expected|`` of each array; bfloat16 one bf16 ulp
(``2**-8``) the same way. On CPU ``psum_scatter`` sums in the same order as ``psum``, so
without clipping FSDP is bit-identical to DDP; with clipping the global norm is summed in
another order (per shard, then across ranks), the scale can differ by one float32 ulp, and
parameters then differ by up to ~6e-8 (2 ulp of their magnitude) after 3 AdamW steps.

The option grid (optimizer x dtype x layout x clipping x N in {2, 4}: 32 runs, ~70 s
on 2 cores) runs as an 8-run orthogonal array, in which every pair of options appears
in all four combinations, plus one N=8 run; ``WORKBENCH_SMALL=0`` runs all 32.
"""

import itertools
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from workbench.adapters.jax.accum import program_counts
from workbench.adapters.jax.base import spec_from_jax
from workbench.adapters.jax.fsdp import make_ddp_step, make_fsdp_step
from workbench.adapters.jax.zero3 import (
    chain_units,
    fsdp_step,
    fsdp_step_sharded,
    make_zero3_step,
)
from workbench.models.jax_mlp import build_problem, mlp_loss

from programs.jax_fsdp_check import make_optimizer

DEVICES = jax.devices()
EVEN = (8, 16, 16, 8)  # every array divisible by 8 (row layout)
ODD = (8, 16, 16, 3)  # l2.b has 3 elements: flat pads, row refuses
CAP = 600  # bytes: 2-3 buckets in float32 and bfloat16
STEPS = 3
MAX_NORM = 0.3  # below the gradient norms of these problems (~0.6-1.2), so clipping is active
RTOL = {"float32": 1e-6, "bfloat16": 2.0**-8}
COLLECTIVES = re.compile(r"\b(all-reduce|reduce-scatter|all-gather|collective-permute|all-to-all)(-start)?\(")


def mesh_1d(n):
    return Mesh(np.array(DEVICES[:n]), ("fsdp",))


def problem(dims, dtype="float32", batch_size=32):
    params, batch = build_problem(0, batch_size, dims)
    return jax.tree_util.tree_map(lambda a: jnp.asarray(a, dtype), (params, batch))


def flat_by_path(tree):
    leaves = jax.tree_util.tree_leaves(tree)
    return {p: np.asarray(a, np.float64).reshape(-1) for p, a in zip(spec_from_jax(tree).paths, leaves)}


def assert_close(actual, expected, what=""):
    for (path, a), e in zip(flat_by_path(actual).items(), jax.tree_util.tree_leaves(expected)):
        rtol = RTOL[jnp.dtype(e.dtype).name]
        e = np.asarray(e, np.float64).reshape(-1)
        np.testing.assert_allclose(a, e, rtol=rtol, atol=rtol * np.abs(e).max(), err_msg=f"{what} {path}")


def ranks_of(mesh, axis="fsdp"):
    """Device -> its index along ``axis``."""
    return {d: idx[mesh.axis_names.index(axis)] for idx, d in np.ndenumerate(mesh.devices)}


def assert_shards_match_plan(shards, grads, plan, mesh):
    """Every device holds exactly its ``rank_slices`` of the DDP-averaged gradient, then zero padding."""
    ranks, spec = ranks_of(mesh), plan.buckets.spec
    for b, arr in enumerate(shards):
        c = int(plan.bucket_chunk_elems[b])
        assert arr.shape == (plan.num_shards * c,) and jnp.dtype(arr.dtype).name == plan.buckets.bucket_dtype(b)
        for shard in arr.addressable_shards:
            local = np.asarray(shard.data, np.float64)
            assert local.shape == (c,)
            pieces = [grads[s.path][s.start : s.stop] for s in plan.rank_slices(ranks[shard.device], b)]
            expected = np.concatenate(pieces)
            rtol = RTOL[plan.buckets.bucket_dtype(b)]
            np.testing.assert_allclose(local[: len(expected)], expected, rtol=rtol, atol=rtol * np.abs(expected).max())
            assert not local[len(expected) :].any(), "padding must stay zero"
    assert spec.num_params == sum(s.stop - s.start for _, s in plan.iter_slices())  # so every element was checked


def run_against_ddp(fsdp, ddp, params, batch, mesh, steps=STEPS, max_norm=None):
    """Run both steps; check per-step metrics and shards; return the final params of both."""
    pf = pd = jax.device_put(params, fsdp.param_sharding)
    b = jax.device_put(batch, fsdp.batch_sharding)
    sf, sd = fsdp.init(pf), ddp.init(pd)
    clipped = False
    for _ in range(steps):
        pf, sf, mf = fsdp.step(pf, sf, b)
        pd_next, sd, md = ddp.step(pd, sd, b)
        grads = flat_by_path(md["grads"])
        norm = np.sqrt(sum((g**2).sum() for g in grads.values()))
        np.testing.assert_allclose(float(mf["grad_norm"]), norm, rtol=1e-6)
        np.testing.assert_allclose(float(md["grad_norm"]), norm, rtol=1e-6)
        np.testing.assert_allclose(float(mf["loss"]), float(md["loss"]), rtol=RTOL[jnp.dtype(md["loss"].dtype).name])
        if fsdp.return_grad_shards:
            assert_shards_match_plan(mf["grad_shards"], grads, fsdp.plan, mesh)
        clipped |= max_norm is not None and norm > max_norm
        pd = pd_next
    assert max_norm is None or clipped, "clipping never triggered: the test would not exercise it"
    for leaf in jax.tree_util.tree_leaves(sf):  # optimizer state: 1/N per device
        if leaf.ndim and fsdp.num_shards > 1:
            assert leaf.sharding.spec == P("fsdp")
            assert {s.data.shape for s in leaf.addressable_shards} == {(leaf.shape[0] // fsdp.num_shards,)}
    return pf, pd, mf


def _grid():
    full = os.environ.get("WORKBENCH_SMALL", "1") == "0"
    for a, b, c, d, e in itertools.product([0, 1], repeat=5):
        if full or (d == a ^ b and e == a ^ c):  # OA(8, 2^5, strength 2): columns A, B, C, AB, AC
            opt, dtype, layout = ("sgd", "adamw")[a], ("float32", "bfloat16")[b], ("row", "flat")[c]
            clip, n = (None, MAX_NORM)[d], (2, 4)[e]
            yield pytest.param(opt, dtype, layout, clip, n, id=f"{opt}-{dtype}-{layout}-{'clip' if clip else 'noclip'}-N{n}")
    yield pytest.param("adamw", "float32", "flat", MAX_NORM, 8, id="adamw-float32-flat-clip-N8")


@pytest.mark.parametrize("opt,dtype,layout,max_norm,n", list(_grid()))
def test_fsdp_equals_ddp(opt, dtype, layout, max_norm, n):
    params, batch = problem(EVEN if layout == "row" else ODD, dtype)
    mesh = mesh_1d(n)
    fsdp = make_fsdp_step(mlp_loss, params, make_optimizer(opt), mesh, layout=layout, max_norm=max_norm,
                          communication_size=CAP, return_grad_shards=True)
    ddp = make_ddp_step(mlp_loss, params, make_optimizer(opt), mesh, max_norm=max_norm, return_grads=True)
    num_buckets = fsdp.plan.buckets.num_buckets
    assert num_buckets >= 2 and (layout == "row" or fsdp.plan.padding_bytes > 0)
    pf, pd, metrics = run_against_ddp(fsdp, ddp, params, batch, mesh, max_norm=max_norm)
    assert metrics["num_collectives"] == 2 * num_buckets + (max_norm is not None)
    assert_close(pf, pd, "FSDP vs DDP")
    assert all(a.dtype == jnp.dtype(dtype) and a.sharding.is_fully_replicated for a in jax.tree_util.tree_leaves(pf))
    assert not np.allclose(np.asarray(pf["l0"]["w"], np.float32), np.asarray(params["l0"]["w"], np.float32))


@pytest.mark.parametrize("layout", ["row", "flat"])
def test_hsdp_on_2x4_mesh_equals_ddp(layout):
    params, batch = problem(EVEN if layout == "row" else ODD)
    mesh = Mesh(np.array(DEVICES).reshape(2, 4), ("replica", "fsdp"))
    fsdp = make_fsdp_step(mlp_loss, params, make_optimizer("adamw"), mesh, dp_axis="replica", layout=layout,
                          max_norm=MAX_NORM, communication_size=CAP, return_grad_shards=True)
    ddp = make_ddp_step(mlp_loss, params, make_optimizer("adamw"), mesh, axis=("replica", "fsdp"), max_norm=MAX_NORM,
                        return_grads=True)
    assert (fsdp.num_shards, fsdp.num_data) == (4, 8)
    pf, pd, metrics = run_against_ddp(fsdp, ddp, params, batch, mesh, max_norm=MAX_NORM)
    assert_close(pf, pd, "HSDP vs DDP")
    b = fsdp.plan.buckets.num_buckets
    text = fsdp.lower(pf, fsdp.init(pf), jax.device_put(batch, fsdp.batch_sharding)).as_text()
    counts = [program_counts(text)[op] for op in ("reduce_scatter", "all_gather", "all_reduce")]
    assert counts == [b, b, b + 2]  # + the loss mean and the norm
    assert metrics["num_collectives"] == 3 * b + 1


@pytest.mark.parametrize("layout,communication_size", [("row", CAP), ("flat", CAP), ("flat", 0), ("row", -1)])
def test_lowered_step_has_one_reduce_scatter_and_all_gather_per_bucket(layout, communication_size):
    params, batch = problem(EVEN if layout == "row" else ODD)
    fsdp = make_fsdp_step(mlp_loss, params, make_optimizer("adamw"), mesh_1d(4), layout=layout, max_norm=MAX_NORM,
                          communication_size=communication_size)
    b = fsdp.plan.buckets.num_buckets
    if communication_size <= 0:
        assert b == len(jax.tree_util.tree_leaves(params))
    p = jax.device_put(params, fsdp.param_sharding)
    text = fsdp.lower(p, fsdp.init(p), jax.device_put(batch, fsdp.batch_sharding)).as_text()
    rs, ag, ar = (program_counts(text)[op] for op in ("reduce_scatter", "all_gather", "all_reduce"))
    assert (rs, ag, ar) == (b, b, 2)  # the all-reduces: the norm (clipping) and the loss mean (a metric)
    assert fsdp.num_collectives == rs + ag + 1


def test_communication_size_le_0_gives_one_bucket_per_array_and_equals_ddp():
    params, batch = problem(EVEN)
    mesh = mesh_1d(2)
    fsdp = make_fsdp_step(mlp_loss, params, optax.sgd(0.1), mesh, communication_size=0)
    ddp = make_ddp_step(mlp_loss, params, optax.sgd(0.1), mesh, return_grads=True)
    assert [fsdp.plan.buckets.bucket(b).tolist() for b in range(fsdp.plan.buckets.num_buckets)] == [[i] for i in range(6)]
    pf, pd, metrics = run_against_ddp(fsdp, ddp, params, batch, mesh)
    assert metrics["num_collectives"] == 12
    assert_close(pf, pd)


@pytest.mark.parametrize("layout", ["row", "flat"])
def test_buckets_follow_the_models_order_and_still_equal_ddp(layout):
    """With ``order`` the buckets are cut over the model's order, not the pytree's sorted keys, and the
    step still equals DDP (its shards hold the ordered plan's slices). The LM the runs train, at 1 MiB:
    its pytree's order cuts 14 buckets, the model's order the 13 MLX plans and the records count."""
    params, batch = problem(EVEN if layout == "row" else ODD)
    mesh = mesh_1d(2)
    order = spec_from_jax(params).paths[::-1]
    fsdp = make_fsdp_step(mlp_loss, params, make_optimizer("adamw"), mesh, layout=layout, communication_size=CAP,
                          max_norm=MAX_NORM, return_grad_shards=True, order=order)
    assert list(fsdp.plan.buckets.spec.paths) == list(order)
    assert [bk.index for bk in fsdp.packed_buckets] != [tuple(map(int, fsdp.plan.buckets.bucket(b)))
                                                         for b in range(fsdp.plan.buckets.num_buckets)]
    ddp = make_ddp_step(mlp_loss, params, make_optimizer("adamw"), mesh, max_norm=MAX_NORM, return_grads=True)
    pf, pd, metrics = run_against_ddp(fsdp, ddp, params, batch, mesh, max_norm=MAX_NORM)
    assert metrics["num_collectives"] == 2 * fsdp.plan.buckets.num_buckets + 1
    assert_close(pf, pd, "FSDP in the model's order vs DDP")

    from workbench.core.units import MiB
    from workbench.models.init import LMConfig, lm_param_shapes
    from workbench.runs.estimate import run_step_shape
    from workbench.runs.spec import VALIDATION_MODEL, RunSpec
    from workbench.strategies import get_strategy

    shapes = {path: jax.ShapeDtypeStruct(shape, jnp.float32)
              for path, shape in lm_param_shapes(LMConfig(**VALIDATION_MODEL)).items()}
    spec = RunSpec(framework="jax", strategy=f"fsdp-{layout}", num_ranks=2, communication_size=MiB,
                   model=dict(VALIDATION_MODEL))
    planned = get_strategy(spec.strategy).collective_counts(run_step_shape(spec))["reduce_scatter"]
    by_tree, by_model = (make_fsdp_step(mlp_loss, shapes, optax.sgd(0.1), mesh, layout=layout, communication_size=MiB,
                                        order=order).collective_counts["reduce_scatter"] for order in (None, list(shapes)))
    assert (by_tree, by_model, planned) == (14, 13, 13)


def test_single_device_communicates_nothing_and_equals_plain_optax():
    params, batch = problem(ODD)
    mesh = mesh_1d(1)
    opt = make_optimizer("adamw")
    fsdp = make_fsdp_step(mlp_loss, params, opt, mesh, layout="flat", max_norm=MAX_NORM, communication_size=CAP)
    ddp = make_ddp_step(mlp_loss, params, opt, mesh, max_norm=MAX_NORM, return_grads=True)
    p = jax.device_put(params, fsdp.param_sharding)
    compiled = fsdp.lower(p, fsdp.init(p), batch).compile().as_text()
    assert not COLLECTIVES.search(compiled), COLLECTIVES.search(compiled)
    assert fsdp.num_collectives == 0 and ddp.num_collectives == 0

    @jax.jit
    def plain_step(params, state):  # the single-device step, written out
        grads = jax.grad(mlp_loss)(params, batch)
        norm = jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree_util.tree_leaves(grads)))
        grads = jax.tree_util.tree_map(lambda g: g * jnp.minimum(MAX_NORM / (norm + 1e-6), 1.0), grads)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    ref, state = params, opt.init(params)
    for _ in range(STEPS):
        ref, state = plain_step(ref, state)
    pf, pd, metrics = run_against_ddp(fsdp, ddp, params, batch, mesh, max_norm=MAX_NORM)
    assert_close(pf, ref, "FSDP(N=1) vs optax")
    assert_close(pd, ref, "DDP(N=1) vs optax")
    assert metrics["num_collectives"] == 0


def test_mixed_dtypes_are_never_promoted():
    params, batch = problem(EVEN)
    params = {k: {"w": v["w"].astype(jnp.bfloat16), "b": v["b"]} for k, v in params.items()}
    mesh = mesh_1d(2)
    fsdp = make_fsdp_step(mlp_loss, params, make_optimizer("adamw"), mesh, max_norm=MAX_NORM, communication_size=CAP,
                          return_grad_shards=True)
    ddp = make_ddp_step(mlp_loss, params, make_optimizer("adamw"), mesh, max_norm=MAX_NORM, return_grads=True)
    bp = fsdp.plan.buckets
    assert {bp.bucket_dtype(b) for b in range(bp.num_buckets)} == {"float32", "bfloat16"}
    pf, pd, _ = run_against_ddp(fsdp, ddp, params, batch, mesh, max_norm=MAX_NORM)  # checks each shard's dtype
    assert jax.tree_util.tree_map(lambda a: a.dtype, pf) == jax.tree_util.tree_map(lambda a: a.dtype, params)
    assert_close(pf, pd, "mixed")


def _units(dims):
    params, batch = problem(dims)
    fns = [lambda p, batch: jnp.tanh(batch[0] @ p["w"] + p["b"]), lambda p, h: jnp.tanh(h @ p["w"] + p["b"]),
           lambda p, h: h @ p["w"] + p["b"]]
    return [params["l0"], params["l1"], params["l2"]], fns, batch


def unit_loss(h, batch):
    return jnp.mean((h - batch[1]) ** 2)


@pytest.mark.parametrize("reshard_after_forward", [True, False])
def test_zero3_equals_ddp(reshard_after_forward):
    units, fns, batch = _units(EVEN)
    n, mesh, opt = 4, mesh_1d(4), make_optimizer("adamw")
    z = make_zero3_step(fns, unit_loss, units, opt, mesh, reshard_after_forward=reshard_after_forward, max_norm=MAX_NORM)
    ddp = make_ddp_step(chain_units(fns, unit_loss), units, opt, mesh, max_norm=MAX_NORM)
    sharded, zs = z.init(units)
    ranks = ranks_of(mesh)
    for leaf, full in zip(jax.tree_util.tree_leaves(sharded), jax.tree_util.tree_leaves(units)):
        assert leaf.shape == (n, full.size // n) and leaf.sharding.spec == P("fsdp")
        for s in leaf.addressable_shards:  # device r holds row r of the (N, -1) reshape, nothing more
            np.testing.assert_array_equal(s.data, np.asarray(full).reshape(n, -1)[ranks[s.device]][None])
    assert all(s.data.shape[0] == 1 for leaf in jax.tree_util.tree_leaves(zs) if leaf.ndim for s in leaf.addressable_shards)

    b = jax.device_put(batch, z.batch_sharding)
    text = z.lower(sharded, zs, b).as_text()
    num_buckets = sum(p.buckets.num_buckets for p in z.plans)
    assert num_buckets == 3  # one per unit
    gathers, scatters = text.count('"stablehlo.all_gather"'), text.count('"stablehlo.reduce_scatter"')
    assert (gathers, scatters) == (num_buckets * (2 if reshard_after_forward else 1), num_buckets)
    pd, sd = units, ddp.init(units)
    for _ in range(STEPS):
        sharded, zs, mz = z.step(sharded, zs, b)
        pd, sd, md = ddp.step(pd, sd, b)
        np.testing.assert_allclose(float(mz["loss"]), float(md["loss"]), rtol=1e-6)
        np.testing.assert_allclose(float(mz["grad_norm"]), float(md["grad_norm"]), rtol=1e-6)
    assert mz["num_collectives"] == gathers + scatters + 1
    assert_close(z.unshard(sharded), pd, "ZeRO-3 vs DDP")
    assert not np.allclose(np.asarray(pd[0]["w"]), np.asarray(units[0]["w"]))


def test_fsdp_step_matches_hand_written_unsharded_step():
    from flax import nnx

    rng = np.random.default_rng(7)
    x, y = rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal((8, 2)).astype(np.float32)
    seed, lr = 3, 0.1
    init = nnx.Linear(4, 2, rngs=nnx.Rngs(seed))
    w, b = np.asarray(init.kernel[...], np.float64), np.asarray(init.bias[...], np.float64)
    r = x.astype(np.float64) @ w + b - y  # the step by hand, in float64
    loss = np.mean(r**2)
    w1, b1 = w - lr * 2 * x.T @ r / r.size, b - lr * 2 * r.sum(0) / r.size

    out = fsdp_step(float(seed), x, y, 2.0, lr)
    assert out.shape == (1,)
    np.testing.assert_allclose(np.asarray(out), [loss], rtol=1e-6)
    sharded_loss, model = fsdp_step_sharded(float(seed), x, y, 2.0, lr)
    np.testing.assert_allclose(np.asarray(sharded_loss), [loss], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(model.kernel[...]), w1, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(model.bias[...]), b1, rtol=1e-6, atol=1e-7)


def test_bad_inputs_raise_errors_naming_the_thing_at_fault():
    params, batch = problem(ODD)
    mesh = mesh_1d(4)
    with pytest.raises(ValueError, match=r"'l2\.b' with shape \(3,\).*divisible by 4"):
        make_fsdp_step(mlp_loss, params, optax.sgd(0.1), mesh, layout="row")
    with pytest.raises(ValueError, match="layout must be 'row' or 'flat'"):
        make_fsdp_step(mlp_loss, params, optax.sgd(0.1), mesh, layout="greedy")
    with pytest.raises(ValueError, match="reduce_scatter must be one of auto, psum_scatter, all_to_all, got 'ring'"):
        make_fsdp_step(mlp_loss, params, optax.sgd(0.1), mesh, layout="flat", reduce_scatter="ring")
    with pytest.raises(ValueError, match="'model' not found"):
        make_fsdp_step(mlp_loss, params, optax.sgd(0.1), mesh, axis="model")
    with pytest.raises(ValueError, match="'replica' not found"):
        make_fsdp_step(mlp_loss, params, optax.sgd(0.1), mesh, layout="flat", dp_axis="replica")

    with pytest.raises(ValueError, match=r"order must name each parameter.*missing \['l2\.b'\].*\['l9\.w'\]"):
        make_fsdp_step(mlp_loss, params, optax.sgd(0.1), mesh, layout="flat",
                       order=[p for p in spec_from_jax(params).paths if p != "l2.b"] + ["l9.w"])
    fsdp = make_fsdp_step(mlp_loss, params, optax.sgd(0.1), mesh, layout="flat")
    with pytest.raises(ValueError, match="tree structure"):
        fsdp.init({k: v for k, v in params.items() if k != "l1"})
    wrong = {**params, "l1": {"w": params["l1"]["w"].astype(jnp.bfloat16), "b": params["l1"]["b"]}}
    with pytest.raises(ValueError, match=r"'l1\.w' is bfloat16\(16, 16\); the plan expects float32\(16, 16\)"):
        fsdp.init(wrong)
    with pytest.raises(ValueError, match=r"shape \(30, 8\).*divisible by the 4"):
        fsdp.step(params, None, (batch[0][:30], batch[1][:30]))

    units, fns, _ = _units(ODD)
    with pytest.raises(ValueError, match=r"'2\.b' with shape \(3,\)"):
        make_zero3_step(fns, unit_loss, units, optax.sgd(0.1), mesh)
    with pytest.raises(ValueError, match="2 unit functions but 3 parameter units"):
        make_zero3_step(fns[:2], unit_loss, units, optax.sgd(0.1), mesh)

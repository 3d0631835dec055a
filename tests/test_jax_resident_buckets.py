"""FSDP's resident form in JAX (issue 30): the parameters live in the plan's bucket buffers for the run.

``FsdpStep.step_buckets`` takes and returns the buckets' buffers (donated, with the optimizer state):
the model reads its parameters as views of them, the gradient is packed into the bucket's shape inside
the step (the reduce-scatter's operand), the optimizer updates this rank's 1/N slice, the all-gather
writes the next buffers. One process, emulated CPU
devices (``conftest.py``); the pytree step it must equal is checked against DDP in ``test_jax_fsdp``.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh

from workbench.adapters.jax.fsdp import make_fsdp_step
from workbench.models.jax_mlp import build_problem, mlp_loss
from workbench.ranks.jax_phases import fsdp_parts

CAP, STEPS, MAX_NORM = 600, 3, 0.3  # CAP: 3 buckets of these MLPs; MAX_NORM: clipping active
DIMS = {"row": (8, 16, 16, 8), "flat": (8, 16, 16, 3)}  # flat: l2.b has 3 elements, so the last bucket is padded


def build(layout, n, *, hsdp=False, **kw):
    params, batch = build_problem(0, 32, DIMS[layout])
    devices = np.array(jax.devices()[: 2 * n if hsdp else n])
    mesh = Mesh(devices.reshape(2, n), ("replica", "fsdp")) if hsdp else Mesh(devices, ("fsdp",))
    step = make_fsdp_step(mlp_loss, params, optax.adamw(1e-2, weight_decay=1e-2), mesh, layout=layout,
                          communication_size=CAP, dp_axis="replica" if hsdp else None, **kw)
    p = jax.device_put(params, step.param_sharding)
    return step, p, jax.device_put(batch, step.batch_sharding)


def leaves(tree):
    return [np.asarray(a) for a in jax.tree_util.tree_leaves(tree)]


@pytest.mark.parametrize("layout,n,kw", [
    ("row", 2, {}),
    ("flat", 4, dict(max_norm=MAX_NORM, num_microbatches=2, defer_sync=False)),
    ("flat", 4, dict(max_norm=MAX_NORM, num_microbatches=2, defer_sync=True)),
    ("row", 4, dict(max_norm=MAX_NORM, hsdp=True)),
], ids=["row-N2", "flat-N4-clip-G2-per-micro", "flat-N4-clip-G2-deferred", "row-HSDP-2x4-clip"])
def test_resident_step_equals_the_pytree_step_bit_for_bit(layout, n, kw):
    step, p, batch = build(layout, n, **kw)
    buffers = step.to_buckets(p)
    assert [b.shape for b in buffers] == [(n * bk.chunk_elems,) for bk in step.packed_buckets]
    assert all(b.sharding.is_fully_replicated for b in buffers)
    for a, e in zip(leaves(step.from_buckets(buffers)), leaves(p)):
        np.testing.assert_array_equal(a, e)  # the round trip loses nothing
    tree_state, state = step.init(p), step.init(p)
    for _ in range(STEPS):
        p, tree_state, mt = step.step(p, tree_state, batch)
        buffers, state, mr = step.step_buckets(buffers, state, batch)
        assert (float(mr["loss"]), float(mr["grad_norm"])) == (float(mt["loss"]), float(mt["grad_norm"]))
        assert mr["num_collectives"] == mt["num_collectives"] == step.num_collectives
    assert not np.allclose(leaves(p)[0], build_problem(0, 32, DIMS[layout])[0]["l0"]["b"])
    for a, e in zip(leaves(step.from_buckets(buffers)), leaves(p)):
        np.testing.assert_array_equal(a, e)
    for a, e in zip(leaves(state), leaves(tree_state)):
        np.testing.assert_array_equal(a, e)


def device_bytes(tree):
    return sum(leaf.addressable_shards[0].data.nbytes for leaf in jax.tree_util.tree_leaves(tree))


def test_the_resident_step_donates_buffers_and_state_and_xla_writes_the_next_ones_into_them():
    step, p, batch = build("flat", 4, max_norm=MAX_NORM)
    buffers, state = step.to_buckets(p), step.init(p)
    resident = step.lower_buckets(buffers, state, batch).compile().memory_analysis()
    assert resident.alias_size_in_bytes == device_bytes(buffers) + device_bytes(state)  # all of it reused
    assert step.lower(p, state, batch).compile().memory_analysis().alias_size_in_bytes == 0  # the pytree step: none
    new, new_state, _ = step.step_buckets(buffers, state, batch)
    assert all(b.is_deleted() for b in buffers) and all(s.is_deleted() for s in jax.tree_util.tree_leaves(state))
    assert [(b.shape, b.dtype) for b in new] == [((4 * bk.chunk_elems,), jnp.dtype(bk.dtype))
                                                 for bk in step.packed_buckets]
    assert all(b.sharding.is_fully_replicated for b in new)
    padding = np.asarray(new[-1])[sum(step.packed_buckets[-1].sizes):]
    assert padding.size > 0 and not padding.any(), "the flat layout's padding must stay zero"


@pytest.mark.parametrize("layout", ["row", "flat"])
def test_the_resident_program_packs_no_parameters_and_updates_only_the_local_slice(layout):
    """In the lowered program every concatenate builds a gradient bucket (one per bucket of several arrays,
    the reduce-scatter's operand): no parameter is packed, as the pytree step packs them on entry. AdamW's
    sqrt runs on c elements per bucket."""
    step, p, batch = build(layout, 4)
    buffers, state = step.to_buckets(p), step.init(p)
    resident = step.lower_buckets(buffers, state, batch).as_text()
    tree = step.lower(p, state, batch).as_text()
    several = sum(len(bk.index) > 1 for bk in step.packed_buckets)
    assert several >= 2
    assert resident.count("stablehlo.concatenate") == several
    assert tree.count("stablehlo.concatenate") == 2 * several  # + the parameters packed on entry
    sqrt_sizes = sorted(int(m) for m in re.findall(r"stablehlo\.sqrt %\S+ : tensor<(\d+)xf32>", resident))
    assert sqrt_sizes == sorted(bk.chunk_elems for bk in step.packed_buckets)


def test_the_resident_parts_compose_into_the_step():
    """``jax_phases``' parts of the resident step, run one after another, give the step's buffers."""
    step, p, batch = build("row", 2)
    parts = fsdp_parts(step, step.mesh)
    assert list(parts) == ["gradient", "reduce_scatter", "update", "all_gather"]
    assert list(fsdp_parts(step, step.mesh, resident=False)) == ["gradient", "pack", "reduce_scatter", "update",
                                                                 "all_gather", "unpack"]
    buffers, state = step.to_buckets(p), step.init(p)
    new, _ = parts["update"](parts["reduce_scatter"](parts["gradient"](buffers, batch)), state, buffers)
    composed = parts["all_gather"](new)
    expected, _, _ = step.step_buckets(buffers, state, batch)
    for a, e in zip(composed, expected):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=1e-6, atol=1e-7)


def test_wrong_buffers_are_refused_naming_the_bucket():
    step, p, batch = build("flat", 4)
    buffers, state = step.to_buckets(p), step.init(p)
    with pytest.raises(ValueError, match="2 bucket buffers given; the plan has 3 buckets"):
        step.step_buckets(buffers[:2], state, batch)
    wrong = [buffers[0], buffers[1].astype(jnp.bfloat16), buffers[2]]
    with pytest.raises(ValueError, match=r"bucket buffer 1 is bfloat16\(\d+,\); the plan expects float32\(\d+,\)"):
        step.step_buckets(wrong, state, batch)
    with pytest.raises(ValueError, match=r"bucket buffer 0 is float32\(3,\)"):
        step.from_buckets([jnp.zeros(3), *buffers[1:]])
    assert not any(b.is_deleted() for b in buffers)  # refused before anything was donated

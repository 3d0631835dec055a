"""Inputs that used to be coerced or crash deep inside (issue 14, items 7, 11-13): refused up front, named."""

import math
import pickle

import numpy as np
import pytest

from workbench.core.buckets import plan_buckets
from workbench.core.checks import MAX_NUM_SHARDS
from workbench.core.shards import plan_shards
from workbench.core.specs import ModelSpec, ParamSpec
from workbench.runs.spec import DEFAULT_MODEL, RunSpec
from workbench.runs.store import run_id_for

MODEL = ModelSpec.from_shapes({"a.w": (8, 4), "b.w": (8,)})


def test_a_run_spec_keeps_its_own_frozen_copy_of_the_model():
    model = dict(DEFAULT_MODEL)
    spec = RunSpec(model=model)
    run_id = run_id_for(spec.to_dict())
    model["dim"] = 128  # the caller's dict, changed after validation
    assert spec.model["dim"] == 64 and run_id_for(spec.to_dict()) == run_id
    with pytest.raises(TypeError, match="RunSpec.model is frozen"):
        spec.model["dim"] = 128
    assert type(spec.to_dict()["model"]) is dict and pickle.loads(pickle.dumps(spec)) == spec
    with pytest.raises(ValueError, match="RunSpec.model='x'"):
        RunSpec(model="x")


@pytest.mark.parametrize("shape", [(2.7, 3), (True, 3), "12", (3, None)])
def test_param_spec_refuses_shapes_it_used_to_coerce(shape):
    with pytest.raises(ValueError, match=r"Parameter 'layer.w' has a shape that is not a sequence of ints"):
        ParamSpec("layer.w", shape)


@pytest.mark.parametrize("shape", [(2**40, 2**40), (2**63,), (2**62,)])
def test_param_spec_refuses_sizes_past_int64_instead_of_wrapping_around(shape):
    with pytest.raises(ValueError, match=r"Parameter 'layer.w' with shape .* do not fit in int64"):
        ParamSpec("layer.w", shape)


def test_param_spec_takes_numpy_integers():
    assert ParamSpec("layer.w", (np.int64(3), 4)).shape == (3, 4)


@pytest.mark.parametrize("size", [math.nan, math.inf, "32MB", 0.5, True])
def test_plan_buckets_refuses_a_communication_size_that_is_not_whole_bytes(size):
    with pytest.raises(ValueError, match="communication_size must be a whole number of bytes"):
        plan_buckets(MODEL, size)


def test_plan_buckets_takes_integral_floats_and_numpy_integers():
    assert plan_buckets(MODEL, 64.0).num_buckets == plan_buckets(MODEL, np.int64(64)).num_buckets


def test_plan_shards_names_a_model_spec_passed_for_a_bucket_plan():
    with pytest.raises(ValueError, match=r"bucket_plan must be a BucketPlan, got ModelSpec; build one with plan_buckets"):
        plan_shards(MODEL, 2)


@pytest.mark.parametrize("layout", ["flat", "greedy", "row"])
def test_plan_shards_bounds_the_ranks_a_plan_allocates_for(layout):
    with pytest.raises(ValueError, match=rf"num_shards must be an integer >= 1 and <= {MAX_NUM_SHARDS:,}"):
        plan_shards(plan_buckets(MODEL, 64), 2**40, layout)


def test_rank_slices_refuses_a_fractional_rank():
    plan = plan_shards(plan_buckets(MODEL, 64), 2, "flat")
    with pytest.raises(ValueError, match="rank 1.5 is not an integer"):
        plan.rank_slices(1.5)
    assert plan.rank_slices(np.int64(1)) == plan.rank_slices(1)


def test_from_shapes_explains_a_list_and_a_bare_dimension():
    with pytest.raises(ValueError, match="from_shapes takes a mapping .* got list"):
        ModelSpec.from_shapes([("a", (4,))])
    with pytest.raises(ValueError, match=r"Parameter 'a': \(4, 'bf16'\) reads as \(shape, dtype\).*\(\(4,\), 'bf16'\)"):
        ModelSpec.from_shapes({"a": (4, "bf16")})


@pytest.mark.parametrize("fields, why", [
    (dict(strategy="hsdp-row", num_ranks=4), r"RunSpec.num_replicas=1: strategy 'hsdp-row' shards within groups"),
    (dict(strategy="hsdp-row", num_ranks=2, num_replicas=2), r"RunSpec.num_replicas=2: .* divide num_ranks=2 into "
                                                             r"groups of at least 2"),
    (dict(strategy="hsdp-row", num_ranks=6, num_replicas=4, global_batch=12), r"RunSpec.num_replicas=4: .* divide"),
    (dict(strategy="fsdp-row", num_ranks=4, num_replicas=2), r"RunSpec.num_replicas=2: strategy 'fsdp-row' has no "
                                                             r"replica groups; num_replicas applies to hsdp-row only"),
    (dict(strategy="hsdp-row", num_ranks=4, num_replicas=2.5), r"RunSpec.num_replicas=2.5: must be an integer >= 1"),
    (dict(strategy="hsdp-row", framework="mlx", num_ranks=4, num_replicas=2), r"RunSpec.strategy='hsdp-row': .* no "
                                                                              r"'mlx' implementation"),
])
def test_hsdp_replica_groups_are_checked_and_named(fields, why):
    with pytest.raises(ValueError, match=why):
        RunSpec(**{"framework": "jax", "global_batch": 8, **fields})


def test_replica_groups_keep_old_run_ids_and_a_spec_dict_is_held_to_the_same_rule():
    from workbench.runs.spec import shard_groups

    assert "num_replicas" not in RunSpec(framework="jax", strategy="fsdp-row").to_dict()  # the id it had before
    hsdp = RunSpec(framework="jax", strategy="hsdp-row", num_ranks=4, num_replicas=2, global_batch=8)
    assert hsdp.shard_group_size == 2 and shard_groups(hsdp.to_dict()) == (2, 2)
    for fields in (dict(strategy="hsdp-row", num_ranks=4), dict(strategy="ddp", num_ranks=4, num_replicas=2)):
        with pytest.raises(ValueError, match=f"num_replicas={fields.get('num_replicas', 1)} with strategy"):
            shard_groups(fields)

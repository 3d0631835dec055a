"""One rule for whole numbers (workbench.core.checks.as_whole), wherever a count or a size is taken.

A count (ranks, shards, micro-batches, a dimension) is a Python or NumPy integer; a size in bytes or a
parameter count may also be a whole float (32e6). Before the rule, num_shards=np.int64(8) worked in
plan_shards and failed in the bucket advisor, and 17 inline copies disagreed."""

import numpy as np
import pytest

from workbench.core.buckets import plan_buckets
from workbench.core.checks import as_whole
from workbench.core.shards import plan_shards
from workbench.core.specs import ModelSpec, ParamSpec
from workbench.estimate.advisor import predict_sync_curve
from workbench.estimate.comm import AlphaBeta
from workbench.estimate.memory import estimate_memory
from workbench.launch.plan import plan_launch
from workbench.runs.spec import RunSpec

SPEC = ModelSpec("m", (ParamSpec("a", (64, 32), "float32"), ParamSpec("b", (32,), "float32")))
LINK = AlphaBeta(alpha_s=1e-5, beta_bytes_per_s=1e9)


@pytest.mark.parametrize("value,count,magnitude", [
    (8, 8, 8), (np.int64(8), 8, 8), (np.uint16(8), 8, 8), (8.0, None, 8), (32e6, None, 32_000_000),
    (np.float64(4.0), None, 4), (8.5, None, None), (float("inf"), None, None), (True, None, None),
    (np.bool_(True), None, None), ("8", None, None), (None, None, None)])
def test_the_rule(value, count, magnitude):
    assert as_whole(value) == count
    assert as_whole(value, magnitude=True) == magnitude


def test_a_numpy_count_is_taken_by_the_planner_the_advisor_the_memory_model_and_a_run_alike():
    n = np.int64(2)
    buckets = plan_buckets(SPEC, 4096)
    assert plan_shards(buckets, n, "row").num_shards == 2
    curve = predict_sync_curve(SPEC, n, {"reduce_scatter": LINK, "all_gather": LINK}, sizes=[np.int64(4096)])
    assert [p.communication_size for p in curve] == [4096] and type(curve[0].communication_size) is int
    assert estimate_memory(SPEC, "fsdp", n).num_shards == 2
    spec = RunSpec(num_ranks=n, global_batch=np.int32(8), steps=np.int64(3), communication_size=32e6)
    assert (spec.num_ranks, spec.global_batch, spec.steps, spec.communication_size) == (2, 8, 3, 32_000_000)
    assert all(type(v) is int for v in (spec.num_ranks, spec.global_batch, spec.communication_size))
    assert plan_launch(np.int64(2), framework="mlx", backend="ring").num_ranks == 2


@pytest.mark.parametrize("call,name", [
    (lambda: predict_sync_curve(SPEC, 2.0, {"reduce_scatter": LINK, "all_gather": LINK}), "num_shards"),
    (lambda: estimate_memory(SPEC, "fsdp", 2.0), "num_shards"),
    (lambda: RunSpec(num_ranks=2.0), "num_ranks"),
    (lambda: RunSpec(steps=np.bool_(True)), "steps"),
    (lambda: plan_launch(True, framework="mlx", backend="ring"), "num_ranks"),
])
def test_a_float_or_a_bool_count_is_refused_naming_it(call, name):
    with pytest.raises(ValueError, match=name):
        call()

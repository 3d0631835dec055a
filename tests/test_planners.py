"""Invariants of the pure core: bucket plans partition parameters, shard plans tile every element once."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench import MiB, ModelSpec, ParamSpec, plan_buckets, plan_shards
from workbench.core.buckets import BucketPolicy

DTYPES = ["float32", "bfloat16", "float16"]


@st.composite
def model_specs(draw, max_params=12, dtypes=("float32",), min_size=1):
    num = draw(st.integers(1, max_params))
    params = []
    for i in range(num):
        ndim = draw(st.integers(1, 3))
        shape = tuple(draw(st.lists(st.integers(min_size, 9), min_size=ndim, max_size=ndim)))
        params.append(ParamSpec(f"layers.{i}.w", shape, draw(st.sampled_from(dtypes))))
    return ModelSpec("random", tuple(params))


def coverage(plan):
    """Count, per parameter, how many times each element is owned."""
    spec = plan.buckets.spec
    owned = {p.path: np.zeros(p.size, np.int64) for p in spec}
    for _, s in plan.iter_slices():
        owned[s.path][s.start : s.stop] += 1
    return owned


# --------------------------------------------------------------------------- buckets


def mlx_reference_groups(sizes, itemsize, communication_size):
    """MLX 0.32's _group_by_size, restated from its source for a NumPy-only test."""
    groups, group, nbytes = [], [], 0
    for i, size in enumerate(sizes):
        group.append(i)
        nbytes += size * itemsize
        if nbytes >= communication_size:
            groups.append(group)
            group, nbytes = [], 0
    if group:
        groups.append(group)
    return groups


@settings(max_examples=200, deadline=None)
@given(spec=model_specs(max_params=20), cap=st.integers(-4, 3000))
def test_mlx_policy_matches_mlx_rule(spec, cap):
    plan = plan_buckets(spec, cap)
    got = [plan.bucket(b).tolist() for b in range(plan.num_buckets)]
    assert got == mlx_reference_groups(spec.sizes.tolist(), 4, cap)


@settings(max_examples=200, deadline=None)
@given(spec=model_specs(max_params=20, dtypes=DTYPES), cap=st.integers(0, 2000), policy=st.sampled_from(["mlx", "pytorch-ddp"]))
def test_buckets_partition_parameters_and_never_mix_dtypes(spec, cap, policy):
    plan = plan_buckets(spec, cap, policy=policy)
    assert sorted(plan.order.tolist()) == list(range(len(spec)))
    assert plan.offsets[0] == 0 and plan.offsets[-1] == len(spec)
    assert np.all(np.diff(plan.offsets) > 0)
    walk = list(range(len(spec)))[:: -1 if policy == "pytorch-ddp" else 1]
    pos = {i: k for k, i in enumerate(walk)}
    for b in range(plan.num_buckets):
        idx = plan.bucket(b).tolist()
        assert len({spec[i].dtype for i in idx}) == 1
        assert [pos[i] for i in idx] == sorted(pos[i] for i in idx)  # walk order kept inside a bucket
    assert plan.bucket_bytes.sum() == spec.nbytes
    if policy == "mlx":  # forward walk, contiguous buckets: order is the parameter order
        assert plan.order.tolist() == list(range(len(spec)))


def test_mlx_policy_closes_at_or_just_above_threshold_with_tail():
    spec = ModelSpec.from_shapes({f"w{i}": (MiB // 4,) for i in range(10)})  # 1 MiB each in fp32
    plan = plan_buckets(spec, 3 * MiB)
    assert plan.bucket_bytes.tolist() == [3 * MiB, 3 * MiB, 3 * MiB, 1 * MiB]
    assert plan.num_under_threshold == 1
    assert plan.num_allreduces_per_step == 4


def test_non_positive_communication_size_gives_one_bucket_per_array():
    spec = ModelSpec.from_shapes({f"w{i}": (3, 5) for i in range(7)})
    for cap in (0, -1):
        plan = plan_buckets(spec, cap)
        assert plan.num_buckets == 7
        assert plan.order.tolist() == list(range(7))


def test_pytorch_policy_reverse_order_first_bucket_1mib_then_cap():
    spec = ModelSpec.from_shapes({f"w{i}": (MiB // 8,) for i in range(12)})  # 0.5 MiB each
    plan = plan_buckets(spec, policy="pytorch-ddp")
    assert plan.communication_size == 25 * MiB
    assert plan.bucket(0).tolist() == [11, 10]  # 1 MiB first bucket, reverse order
    assert plan.bucket(1).tolist() == list(range(9, -1, -1))  # the rest fits under 25 MiB
    plan = plan_buckets(spec, 2 * MiB, policy="pytorch-ddp")
    assert [plan.bucket(b).tolist() for b in range(plan.num_buckets)] == [[11, 10], [9, 8, 7, 6], [5, 4, 3, 2], [1, 0]]


def test_pytorch_policy_keeps_one_open_bucket_per_dtype():
    spec = ModelSpec.from_shapes(
        {"a": ((MiB // 4,), "float32"), "b": ((MiB // 2,), "bfloat16"), "c": ((MiB // 4,), "float32")}
    )
    plan = plan_buckets(spec, policy="pytorch-ddp")
    # Walking c, b, a: c (1 MiB fp32) closes the fp32 first bucket; b closes bf16's; a is the fp32 tail.
    assert [plan.bucket(b).tolist() for b in range(plan.num_buckets)] == [[2], [1], [0]]


def test_mlx_policy_splits_at_dtype_change_instead_of_promoting():
    spec = ModelSpec.from_shapes({"a": ((4,), "float32"), "b": ((4,), "bfloat16"), "c": ((4,), "bfloat16")})
    plan = plan_buckets(spec, MiB)
    assert [plan.bucket_paths(b) for b in range(plan.num_buckets)] == [["a"], ["b", "c"]]
    assert [plan.bucket_dtype(b) for b in range(2)] == ["float32", "bfloat16"]


def test_before_overflow_policy_never_exceeds_cap_unless_single_array():
    pol = BucketPolicy(name="deepspeed-like", close="before_overflow")
    spec = ModelSpec.from_shapes({"a": (3,), "b": (3,), "c": (10,), "d": (1,)})
    plan = plan_buckets(spec, 24, policy=pol)  # 24 bytes = 6 fp32 elements
    assert [plan.bucket_paths(b) for b in range(plan.num_buckets)] == [["a", "b"], ["c"], ["d"]]


def test_zero_size_array_and_unknown_policy_are_rejected():
    spec = ModelSpec.from_shapes({"ok": (3,), "layers.1.empty": (0, 4)})
    with pytest.raises(ValueError, match=r"layers\.1\.empty.*\(0, 4\)"):
        plan_buckets(spec)
    with pytest.raises(ValueError, match="fancy"):
        plan_buckets(ModelSpec.from_shapes({"a": (2,)}), policy="fancy")


def test_spec_errors_name_the_parameter():
    with pytest.raises(ValueError, match=r"Duplicate parameter path 'x'"):
        ModelSpec("m", (ParamSpec("x", (2,)), ParamSpec("x", (3,))))
    with pytest.raises(ValueError, match=r"float7.*'layers\.0\.w'"):
        ParamSpec("layers.0.w", (2,), "float7")
    assert ParamSpec("w", (2, 3), "bf16").nbytes == 12
    assert ParamSpec("s", ()).size == 1


# --------------------------------------------------------------------------- shards


@settings(max_examples=150, deadline=None)
@given(
    spec=model_specs(max_params=10, dtypes=DTYPES),
    cap=st.integers(0, 600),
    n=st.integers(1, 7),
    layout=st.sampled_from(["flat", "greedy", "row-padded"]),
)
def test_every_element_owned_exactly_once(spec, cap, n, layout):
    bp = plan_buckets(spec, cap)
    plan = plan_shards(bp, n, "row", pad_rows=True) if layout == "row-padded" else plan_shards(bp, n, layout)
    for path, counts in coverage(plan).items():
        assert np.all(counts == 1), path
    # per-rank owned bytes agree with the slices
    isz = {p.path: p.itemsize for p in spec}
    for r in range(n):
        assert plan.rank_owned_bytes[r] == sum((s.stop - s.start) * isz[s.path] for s in plan.rank_slices(r))
        assert plan.rank_fragments[r] == len(plan.rank_slices(r))
    assert plan.rank_owned_bytes.sum() == spec.nbytes
    assert plan.num_split_arrays == sum(
        len({r for r, s in plan.iter_slices() if s.path == p.path}) > 1 for p in spec
    )


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 6), data=st.data())
def test_row_layout_gives_each_rank_its_contiguous_row(n, data):
    params = []
    for i in range(data.draw(st.integers(1, 8))):
        rows = data.draw(st.integers(1, 4)) * n
        params.append(ParamSpec(f"p{i}", (rows, data.draw(st.integers(1, 5))), data.draw(st.sampled_from(DTYPES))))
    spec = ModelSpec("rows", tuple(params))
    plan = plan_shards(plan_buckets(spec, data.draw(st.integers(0, 400))), n, "row")
    for r in range(n):
        slices = plan.rank_slices(r)
        assert [s.path for s in slices] == [spec[int(i)].path for i in plan.buckets.order]
        for s in slices:
            size = spec[spec.paths.index(s.path)].size
            assert (s.start, s.stop) == (r * size // n, (r + 1) * size // n)
    assert plan.padding_bytes == 0 and plan.imbalance == 1.0
    assert plan.num_reduce_scatters == plan.num_all_gathers == plan.buckets.num_buckets


@settings(max_examples=100, deadline=None)
@given(spec=model_specs(max_params=10, dtypes=DTYPES), cap=st.integers(0, 600), n=st.integers(1, 9))
def test_flat_chunks_are_equal_and_padding_is_at_the_end(spec, cap, n):
    bp = plan_buckets(spec, cap)
    plan = plan_shards(bp, n, "flat")
    chunks = -(-bp.bucket_elems // n)
    assert plan.bucket_chunk_elems.tolist() == chunks.tolist()
    assert np.all(plan.rank_bytes == (chunks * bp.bucket_itemsize).sum())
    pad = (chunks * n - bp.bucket_elems) * bp.bucket_itemsize
    assert plan.padding_bytes == pad.sum()
    # padding sits with the last ranks: owned bytes never increase with rank inside a bucket
    assert np.all(np.diff(plan.rank_owned_bytes) <= 0) or bp.num_buckets > 1


def test_greedy_is_largest_first_to_least_loaded():
    spec = ModelSpec.from_shapes({"a": (10,), "b": (7,), "c": (5,), "d": (4,), "e": (1,)})
    plan = plan_shards(plan_buckets(spec, 0), 2, "greedy")
    # a->0 (10), b->1 (7), c->1 (12), d->0 (14), e->1 (13)
    assert plan.param_owner.tolist() == [0, 1, 1, 0, 1]
    assert plan.rank_owned_bytes.tolist() == [56, 52]
    assert plan.imbalance == pytest.approx(56 / 54)
    assert plan.num_all_reduces == 5 and plan.num_broadcasts == 2 and plan.num_split_arrays == 0


def test_row_errors_name_path_and_shape():
    spec = ModelSpec.from_shapes({"ok": (4, 4), "layers.2.mlp.w": (3, 5)})
    with pytest.raises(ValueError, match=r"'layers\.2\.mlp\.w' with shape \(3, 5\).*divisible by 2"):
        plan_shards(plan_buckets(spec), 2, "row")
    padded = plan_shards(plan_buckets(spec), 2, "row", pad_rows=True)
    assert padded.padding_bytes == 4  # 15 elements padded to 16
    spec = ModelSpec.from_shapes({"w": (3, 4)})  # size divisible by 2, axis 0 is not
    plan_shards(plan_buckets(spec), 2, "row")
    with pytest.raises(ValueError, match=r"'w' with shape \(3, 4\).*axis 0"):
        plan_shards(plan_buckets(spec), 2, "row", require_axis0=True)
    with pytest.raises(ValueError, match=r"'scale' is a scalar"):
        plan_shards(plan_buckets(ModelSpec.from_shapes({"scale": ()})), 2, "row")


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "4"])
def test_num_shards_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match="num_shards"):
        plan_shards(plan_buckets(ModelSpec.from_shapes({"w": (4,)})), bad, "flat")
    with pytest.raises(ValueError, match="diagonal"):
        plan_shards(plan_buckets(ModelSpec.from_shapes({"w": (4,)})), 2, "diagonal")


def test_single_shard_owns_everything_without_padding():
    spec = ModelSpec.from_shapes({"a": (3, 3), "b": (5,)})
    for layout in ("row", "flat", "greedy"):
        plan = plan_shards(plan_buckets(spec), 1, layout)
        assert plan.rank_owned_bytes.tolist() == [spec.nbytes]
        assert plan.padding_bytes == 0 and plan.num_split_arrays == 0


def test_bucket_summary_reports_the_plan():
    # fp32: a = 1024 B closes bucket 0; b + c + d = 512 + 32 + 800 B closes bucket 1; e = 32 B is the tail.
    spec = ModelSpec.from_shapes({"a": (256,), "b": (4, 32), "c": (8,), "d": (200,), "e": (8,)})
    plan = plan_buckets(spec, 1024)
    s = plan.summary()
    assert s["num_buckets"] == plan.num_buckets == 3 and s["num_allreduces_per_step"] == 3
    assert (s["min_bucket_bytes"], s["max_bucket_bytes"]) == (32, 1344)
    assert s["num_under_threshold"] == 1 and s["max_arrays_per_bucket"] == 3
    assert plan.busiest_bucket() == 1 and plan.bucket_paths(1) == ["b", "c", "d"]


@settings(max_examples=60, deadline=None)
@given(spec=model_specs(max_params=10, dtypes=DTYPES), cap=st.integers(0, 600), n=st.integers(1, 6),
       layout=st.sampled_from(["flat", "greedy"]))
def test_rank_slices_of_one_bucket_are_that_buckets_share_of_all(spec, cap, n, layout):
    plan = plan_shards(plan_buckets(spec, cap), n, layout)
    for r in range(n):
        every = plan.rank_slices(r)
        per_bucket = [s for b in range(plan.buckets.num_buckets) for s in plan.rank_slices(r, b)]
        assert per_bucket == every
    with pytest.raises(ValueError, match="bucket"):
        plan.rank_slices(0, plan.buckets.num_buckets)

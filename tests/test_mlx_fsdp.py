"""The MLX FSDP step equals DDP: on real processes (ring backend, 2 and 4 ranks) and in one process."""


import os

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import pytest
from mlx.utils import tree_flatten

from workbench import plan_buckets, plan_shards
from workbench.adapters.mlx.base import spec_from_mlx
from workbench.adapters.mlx.fsdp import fsdp_apply_gradients, optimizer_state_bytes
from workbench.core.envvars import RING_PIECE_BYTES, RING_PIECE_ENV
from workbench.launch.hosts import Host, HostsFile, plan_hosts_launch
from workbench.launch.plan import plan_launch, thread_env
from workbench.launch.local_run import LaunchError, run_local, run_worker

from programs import rank_env

# fp32: the 1e-6 relative (the ring sums in another order than MLX's all_sum, ~1e-7 apart).
# bf16: 2 ulps (eps = 2**-7): the ring adds in bf16 hop by hop, MLX's all_sum in its own order.
RTOL = {"float32": 1e-6, "bfloat16": 2 * 2**-7}


@pytest.fixture(scope="module", params=[2, 4], ids=["2-ranks", "4-ranks"])
def ring_run(request, tmp_path_factory):
    n = request.param
    out = tmp_path_factory.mktemp(f"mlx{n}")
    return n, run_worker(plan_launch(n, framework="mlx", backend="ring", env=rank_env()), "programs.mlx_fsdp_check", out,
                         timeout_s=240, workdir=out / "logs")


def ok_results(ranks):
    for res in ranks[0]["results"]:
        if "error" not in res:
            yield res


def assert_close(got, want, rtol):
    got, want = np.asarray(got), np.asarray(want)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max())


def test_every_rank_ends_with_the_same_parameters(ring_run):
    n, ranks = ring_run
    for i, res in enumerate(ranks[0]["results"]):
        for other in ranks[1:]:
            assert other["results"][i].get("fsdp_params") == res.get("fsdp_params"), res["case"]


def test_fsdp_parameters_equal_ddp_after_several_steps(ring_run):
    n, ranks = ring_run
    checked = 0
    for res in ok_results(ranks):
        case = res["case"]
        for path, want in res["ddp_params"].items():
            assert_close(res["fsdp_params"][path], want, RTOL[case["dtype"]])
        assert res["dtypes"] == [f"mlx.core.{case['dtype']}"]  # never promoted
        checked += 1
    assert checked == 20  # 16 grid cases (sgd/adamw x fp32/bf16 x row/flat x clip) + 4 others


def test_fsdp_is_mlx_v0320_fsdp_apply_gradients_bit_for_bit_at_two_ranks(ring_run):
    """Against MLX v0.32.0's own algorithm (programs.mlx_fsdp_check.mlx_v0320_fsdp_apply_gradients), fp32
    AdamW, 3 steps: identical bits at 2 ranks, where every sum is a + b; at 4 ranks the ring adds in
    another order than all_sum, so within the fp32 tolerance."""
    n, ranks = ring_run
    for rank in ranks:
        got, want = rank["bit_identity"]["workbench"], rank["bit_identity"]["mlx_v0320"]
        assert got.keys() == want.keys()
        for path in want:
            if n == 2:
                assert got[path] == want[path], path
            else:
                assert_close(got[path], want[path], RTOL["float32"])


def test_a_gather_in_pieces_equals_mlxs_one_call_bit_for_bit(ring_run):
    """Where a launch puts more ranks on a host than half its cores, MLX's ring ranks gather a shard of 512 KiB or
    more in pieces under it (launch.plan.thread_env); what comes back is MLX's own all_gather's, bit for bit, in
    rank order, and the 2-rank reduce-scatter through it is too. So are the lazy gather and reduce-scatter that
    MLX's fully_shard (supplied) and the workbench's ZeRO-3 build into their graphs."""
    n, ranks = ring_run
    for rank in ranks:
        one, pieces = rank["pieces"]["one call"], rank["pieces"]["pieces"]
        assert one["calls"] == {"all_gather": 1} and pieces["calls"] == {"all_gather": 4}  # 3 x 256 KiB and a part
        if n == 2:  # the reduce-scatter is one exchange of the other rank's row, in pieces as the gather
            assert one["rs_calls"] == {"all_gather": 1} and pieces["rs_calls"] == {"all_gather": 4}
            assert one["lazy_calls"] == {"all_gather": 2} and pieces["lazy_calls"] == {"all_gather": 8}
        else:  # a ring of sends and receives, one socket thread each: never in pieces
            assert one["rs_calls"] == pieces["rs_calls"] == {"send": n - 1, "recv_like": n - 1}
            assert one["lazy_calls"] == {"all_gather": 1, "send": n - 1, "recv_like": n - 1}
            assert pieces["lazy_calls"] == {"all_gather": 4, "send": n - 1, "recv_like": n - 1}
        assert pieces["gathered"] == one["gathered"] and pieces["summed"] == one["summed"]
        assert pieces["lazy_gathered"] == one["lazy_gathered"] and pieces["lazy_summed"] == one["lazy_summed"]
        assert np.array(one["lazy_gathered"]).ravel().tolist() == one["gathered"]  # (N, c): rank k's shard in row k
        assert one["lazy_summed"] == one["summed"]
        assert len(one["gathered"]) == n * 200_003
        assert one["gathered"][rank["rank"] * 200_003:(rank["rank"] + 1) * 200_003] == rank["pieces"]["own"]


def test_grad_norm_is_the_norm_of_the_averaged_gradient(ring_run):
    n, ranks = ring_run
    clipped = [res for res in ok_results(ranks) if res["case"]["max_norm"] is not None]
    assert len(clipped) == 10
    for res in clipped:
        assert None not in res["fsdp_norms"] and len(res["fsdp_norms"]) == 3
        assert_close(res["fsdp_norms"], res["ddp_norms"], RTOL[res["case"]["dtype"]])


def test_each_rank_holds_its_slice_of_the_averaged_gradient(ring_run):
    n, ranks = ring_run
    for rank in ranks:
        for res in ok_results([rank]):
            got, want = np.array(res["shard_got"]), np.array(res["shard_want"])
            assert got.shape == want.shape and got.size > 0
            assert_close(got, want, RTOL[res["case"]["dtype"]])


def test_collectives_per_step_match_the_bucket_plan(ring_run):
    n, ranks = ring_run
    assert [r["sum_scatter_supported"] for r in ranks] == [False] * n  # "[ring] sum_scatter not supported."
    for res in ok_results(ranks):
        case = res["case"]
        checks = [report["num_rank_checks"] for report in res["reports"]]
        assert checks[0] in (0, 1) and checks[1:] == [0] * (len(checks) - 1)  # once per plan, then never
        for counts, report in zip(res["counts"], res["reports"]):
            b = report["num_buckets"]
            clip = 1 if case["max_norm"] is not None else 0
            # The ranks' plan check is one all_gather, on the first step of a plan only (issue 14, item 9).
            counts = {**counts, "all_gather": counts.get("all_gather", 0) - report["num_rank_checks"]}
            assert b == report["num_all_gathers"] == report["num_reduce_scatters"]
            if case["reduce_scatter"] == "all_sum":
                assert report["reduce_scatter_transport"] == "all_sum"
                assert counts.get("all_sum", 0) == b + clip and counts.get("send", 0) == 0
                assert counts.get("all_gather", 0) == b
            elif case["reduce_scatter"] == "send_recv":  # the ring over send/recv, at any N
                assert report["reduce_scatter_transport"] == "send_recv" and report["ring_transport"] == "send/recv"
                assert counts.get("send", 0) == counts.get("recv_like", 0) == (n - 1) * b
                assert counts.get("all_gather", 0) == b and counts.get("all_sum", 0) == clip
            elif n == 2:  # ring backend, two ranks: the ring's one hop is an all_gather exchange
                assert report["reduce_scatter_transport"] == "ring" and report["ring_transport"] == "all_gather exchange"
                assert counts.get("all_gather", 0) == 2 * b and counts.get("send", 0) == 0
                assert counts.get("all_sum", 0) == clip and counts.get("sum_scatter", 0) == 0
            else:  # ring backend: no sum_scatter, so the workbench's send/recv ring
                assert report["reduce_scatter_transport"] == "ring" and report["ring_transport"] == "send/recv"
                assert counts.get("send", 0) == counts.get("recv_like", 0) == (n - 1) * b
                assert counts.get("all_gather", 0) == b
                assert counts.get("all_sum", 0) == clip and counts.get("sum_scatter", 0) == 0
            # A reduce-scatter moves (N-1)/N of the bucket per rank, like the all-gather; all_sum twice that.
            factor = 2 if case["reduce_scatter"] == "all_sum" else 1
            assert report["reduce_scatter_bytes_sent"] == factor * report["all_gather_bytes_sent"] > 0
        if case["communication_size"] == 0:
            assert res["reports"][0]["num_buckets"] == 6  # one per array of the 3-layer MLP


def test_optimizer_state_is_one_nth_of_ddp(ring_run):
    n, ranks = ring_run
    for res in ok_results(ranks):
        if res["case"]["model"] == "even":  # no padding: exactly 1/N of the moments
            scalars = 12  # every MLX optimizer keeps a uint64 step and an fp32 learning rate
            assert (res["fsdp_state_bytes"] - scalars) * n == res["ddp_state_bytes"] - scalars


def test_row_layout_refuses_indivisible_arrays_naming_them_and_hsdp_names_the_backend(ring_run):
    n, ranks = ring_run
    for rank in ranks:
        errors = [res["error"] for res in rank["results"] if "error" in res]
        assert len(errors) == 1 and "Cannot shard parameter 'layers." in errors[0] and f"into {n} rows" in errors[0]
        assert "ring backend does not support" in rank["hsdp"] and "Group.split" in rank["hsdp"]


def test_a_failing_rank_surfaces_as_an_error_naming_it(tmp_path):
    with pytest.raises(LaunchError, match=r"rank [01] of 2 exited"):
        run_local(plan_launch(2), ["-c", "import os, sys; sys.exit(3 if os.environ['MLX_RANK'] == '1' else 0)"],
                  timeout_s=30)
    with pytest.raises(LaunchError, match="timed out") as info:
        run_local(plan_launch(2), ["-c", "import time; time.sleep(60)"], timeout_s=2)
    assert info.value.rank is None


# ----------------------------------------------------------------------------- one process


def small_problem(dtype=mx.float32):
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    model.set_dtype(dtype)
    x, y = mx.random.normal((16, 4), key=mx.random.key(0)), mx.random.normal((16, 2), key=mx.random.key(1))
    grads = nn.value_and_grad(model, lambda m, x, y: ((m(x) - y) ** 2).mean())(model, x.astype(dtype), y)[1]
    return model.trainable_parameters(), grads


@pytest.mark.parametrize("layout", ["row", "flat"])
@pytest.mark.parametrize("communication_size", [0, 64, 32 * 2**20])
def test_group_of_one_equals_a_plain_optimizer_step(layout, communication_size):
    params, grads = small_problem()
    report = {}
    got = fsdp_apply_gradients(grads, params, optim.AdamW(1e-2), layout=layout,
                               communication_size=communication_size, report=report)
    want = optim.AdamW(1e-2).apply_gradients(grads, params)
    for (k, a), (_, b) in zip(tree_flatten(got), tree_flatten(want)):
        np.testing.assert_array_equal(np.array(a), np.array(b), err_msg=k)
    assert report["reduce_scatter_transport"] == "none" and report["num_reduce_scatters"] == 0
    assert report["num_buckets"] == plan_buckets(spec_from_mlx(params), communication_size).num_buckets
    assert report["num_buckets"] == {0: 4, 64: 3, 32 * 2**20: 1}[communication_size]


def test_clipping_returns_the_norm_before_clipping_and_keeps_bf16():
    params, grads = small_problem(mx.bfloat16)
    new, norm = fsdp_apply_gradients(grads, params, optim.SGD(0.1), max_norm=1e-3)
    full = np.sqrt(sum(float((g.astype(mx.float32) ** 2).sum()) for _, g in tree_flatten(grads)))
    assert norm.item() == pytest.approx(full, rel=1e-6)
    assert {v.dtype for _, v in tree_flatten(new)} == {mx.bfloat16}


@pytest.mark.parametrize("empty", [{}, []])
def test_an_empty_tree_comes_back_as_the_same_kind_of_tree(empty):
    assert fsdp_apply_gradients(empty, empty, optim.SGD(0.1)) == empty
    assert type(fsdp_apply_gradients(empty, empty, optim.SGD(0.1))) is type(empty)
    tree, norm = fsdp_apply_gradients(empty, empty, optim.SGD(0.1), max_norm=1.0)
    assert type(tree) is type(empty) and norm.item() == 0.0


class HandsBackItsInput:
    """An optimizer whose update returns one of the trees it was given, as a no-op or an in-place
    optimizer may: ``which`` picks the gradients or the parameters."""

    def __init__(self, which):
        self.which, self.state = which, {}

    def apply_gradients(self, gradients, parameters):
        return gradients if self.which == "gradients" else parameters


@pytest.mark.parametrize("which", ["gradients", "parameters"])
def test_an_optimizer_that_returns_its_input_tree_works(which):
    params, grads = small_problem()
    got = fsdp_apply_gradients(grads, params, HandsBackItsInput(which), communication_size=64)
    want = grads if which == "gradients" else params  # on one rank the shards are the whole arrays
    for (k, a), (_, b) in zip(tree_flatten(got), tree_flatten(want)):
        np.testing.assert_array_equal(np.array(a), np.array(b), err_msg=k)


def test_bad_input_names_the_path():
    params, grads = small_problem()
    bad = dict(grads)
    bad["layers"] = [grads["layers"][0], {"weight": grads["layers"][1]["weight"]}]
    with pytest.raises(ValueError, match=r"layers\.1\.bias"):
        fsdp_apply_gradients(bad, params, optim.SGD(0.1))
    wrong_shape = {"layers": [grads["layers"][0], {**grads["layers"][1], "bias": mx.zeros((3,))}]}
    with pytest.raises(ValueError, match=r"'layers\.1\.bias' has shape \(3,\)"):
        fsdp_apply_gradients(wrong_shape, params, optim.SGD(0.1))
    with pytest.raises(ValueError, match="layout"):
        fsdp_apply_gradients(grads, params, optim.SGD(0.1), layout="diagonal")
    with pytest.raises(ValueError, match="reduce_scatter"):
        fsdp_apply_gradients(grads, params, optim.SGD(0.1), reduce_scatter="carrier-pigeon")


def test_optimizer_state_bytes_counts_the_moments():
    params, grads = small_problem()
    opt = optim.Adam(1e-2)
    opt.apply_gradients(grads, params)
    moments = 2 * sum(v.nbytes for _, v in tree_flatten(params))
    assert optimizer_state_bytes(opt) == moments + 12  # + uint64 step + fp32 learning rate


@pytest.mark.parametrize("layout", ["row", "flat"])
def test_mixed_dtypes_keep_their_own_buckets_and_dtypes(layout):
    params = {"a": mx.ones((4, 4)), "b": mx.ones((8,), dtype=mx.bfloat16), "c": mx.ones((2, 4))}
    grads = {"a": mx.full((4, 4), 0.5), "b": mx.full((8,), 0.25, dtype=mx.bfloat16), "c": mx.full((2, 4), 2.0)}
    report = {}
    new = fsdp_apply_gradients(grads, params, optim.SGD(0.1), layout=layout, report=report)
    assert report["num_buckets"] == 3  # fp32 | bf16 | fp32: the bucket closes at each dtype change
    assert (new["a"].dtype, new["b"].dtype, new["c"].dtype) == (mx.float32, mx.bfloat16, mx.float32)
    want = optim.SGD(0.1).apply_gradients(grads, params)
    for k in params:
        np.testing.assert_array_equal(np.array(new[k].astype(mx.float32)), np.array(want[k].astype(mx.float32)))


def test_launch_plans_wire_each_backend(monkeypatch):
    monkeypatch.delenv(RING_PIECE_ENV, raising=False)  # the launch's own choice, not this shell's
    ring = plan_launch(3, framework="mlx", backend="ring", ports=[7001, 7002, 7003])
    assert ring.hostfile == [["127.0.0.1:7001"], ["127.0.0.1:7002"], ["127.0.0.1:7003"]]
    assert [e["MLX_RANK"] for e in ring.rank_env] == ["0", "1", "2"]
    nccl = plan_launch(2, framework="mlx", backend="nccl", ports=[7100])
    assert nccl.hostfile is None
    assert [(e["CUDA_VISIBLE_DEVICES"], e["NCCL_PORT"], e["MLX_WORLD_SIZE"]) for e in nccl.rank_env] == [("0", "7100", "2"), ("1", "7100", "2")]
    jax = plan_launch(2, framework="jax", ports=[7200])
    assert jax.coordinator == "127.0.0.1:7200" and [e["WORKBENCH_PROCESS_ID"] for e in jax.rank_env] == ["0", "1"]
    # more ranks than half the cores: the ring's ranks gather in pieces (each polls a core per socket thread); every
    # rank of a plan is told, one call or pieces, so none follows an environment of its own; MPI's and JAX's never
    assert {e[RING_PIECE_ENV] for e in ring.rank_env} == {str(RING_PIECE_BYTES) if 6 > os.cpu_count() else "0"}
    assert thread_env(2, cores=4)[RING_PIECE_ENV] == "0" and thread_env(3, cores=4)[RING_PIECE_ENV] == "262144"
    monkeypatch.setenv(RING_PIECE_ENV, "131072")  # this shell's choice is kept for the ring, and only there
    assert {e[RING_PIECE_ENV] for e in plan_launch(2, framework="mlx", backend="ring").rank_env} == {"131072"}
    assert {e[RING_PIECE_ENV] for e in plan_launch(2, framework="mlx", backend="mpi").rank_env} == {"0"}
    assert all(RING_PIECE_ENV not in e for e in plan_launch(2, framework="jax").rank_env)
    monkeypatch.delenv(RING_PIECE_ENV)
    # a hosts file's ranks: the busiest host's count decides (two hosts of one slot: as one rank here), not all ranks
    two_hosts = plan_hosts_launch(HostsFile(hosts=(Host(address="10.0.0.11"), Host(address="10.0.0.12"))),
                                  framework="mlx", ports=[7001, 7002])
    assert {e[RING_PIECE_ENV] for e in two_hosts.rank_env} == {thread_env(1)[RING_PIECE_ENV]}
    # hosts that say their cores: the most crowded by ranks per core decides (the rig's namespaces share 2 cores)
    rig = plan_hosts_launch(HostsFile(hosts=(Host(address="10.0.0.11", cores=1), Host(address="10.0.0.12", cores=1))),
                            framework="mlx", ports=[7001, 7002])
    assert {(e[RING_PIECE_ENV], e["OMP_NUM_THREADS"]) for e in rig.rank_env} == {(str(RING_PIECE_BYTES), "1")}
    big = (Host(address="10.0.0.11", slots=4, cores=64), Host(address="10.0.0.12", slots=2, cores=2))
    assert {(e[RING_PIECE_ENV], e["OMP_NUM_THREADS"]) for e in plan_hosts_launch(
        HostsFile(hosts=big), framework="mlx", ports=list(range(7001, 7007))).rank_env} == {(str(RING_PIECE_BYTES), "1")}
    roomy = plan_hosts_launch(HostsFile(hosts=big[:1]), framework="mlx", ports=list(range(7001, 7005)))
    assert {(e[RING_PIECE_ENV], e["OMP_NUM_THREADS"]) for e in roomy.rank_env} == {("0", "16")}
    for bad in ("1e5", "512", "²", str(2 * RING_PIECE_BYTES)):  # refused before any rank starts, naming the variable
        with pytest.raises(ValueError, match=f"WORKBENCH_MLX_RING_PIECE={bad!r}"):
            plan_launch(2, framework="mlx", backend="ring", env={RING_PIECE_ENV: bad})
    with pytest.raises(ValueError, match="ports"):
        plan_launch(2, framework="mlx", backend="ring", ports=[7001])
    with pytest.raises(ValueError, match="num_ranks"):
        plan_launch(0)
    with pytest.raises(ValueError, match="gloo"):
        plan_launch(2, framework="mlx", backend="gloo")


def test_rows_follow_the_plan_they_are_given_even_when_plans_come_and_go():
    from workbench.adapters.mlx.rows import bucket_row

    arrays = [mx.arange(8, dtype=mx.float32), mx.arange(8, 16, dtype=mx.float32)]
    spec = spec_from_mlx({"a": arrays[0], "b": arrays[1]})
    for _ in range(50):  # fresh plans, collected between iterations: ids get reused
        for layout, want in (("row", [0, 1, 2, 3, 8, 9, 10, 11]), ("flat", [0, 1, 2, 3, 4, 5, 6, 7])):
            plan = plan_shards(plan_buckets(spec, 2**20), 2, layout)
            assert np.array(bucket_row(arrays, plan, 0, 0)).tolist() == want
            del plan


def test_caches_are_bounded_and_can_be_cleared():
    from workbench.adapters.mlx import rows
    from workbench.adapters.mlx.rows import bucket_row, clear_caches, get_plan

    clear_caches()
    params = [("w", mx.zeros((8,)))]
    plans = [get_plan(params, size, 2, "row") for size in range(1, rows.PLAN_CACHE_SIZE + 20)]
    assert rows._plan.cache_info().currsize == rows.PLAN_CACHE_SIZE  # only so many are kept
    assert get_plan(params, rows.PLAN_CACHE_SIZE + 19, 2, "row") is plans[-1]  # the newest, served cached
    assert get_plan(params, 1, 2, "row") is not plans[0]  # the oldest was let go, and is planned again
    arrays = [mx.arange(8, dtype=mx.float32)]
    spec = spec_from_mlx({"w": arrays[0]})
    kept = [plan_shards(plan_buckets(spec, 2**20), 2, "flat") for _ in range(10)]
    for plan in kept:
        for _ in range(3):
            bucket_row(arrays, plan, 0, 0)
    assert len(rows._PIECES) == 10
    clear_caches()
    assert rows._plan.cache_info().currsize == 0 and not rows._PIECES


@pytest.mark.parametrize("layout", ["row", "flat"])
@pytest.mark.parametrize("n", [2, 4])
def test_bucket_matrix_rows_are_the_plans_rows(layout, n):
    """One copy of each array per bucket gives, row for row, what the plan's slices give (a transposed
    array, as MLX hands back a weight's gradient, and flat padding included)."""
    from workbench.adapters.mlx.rows import bucket_matrix, bucket_row

    arrays = [mx.arange(8 * 12, dtype=mx.float32).reshape(12, 8).T, mx.arange(4, dtype=mx.float32) + 1000,
              mx.arange(20, dtype=mx.float32).reshape(4, 5) + 2000]
    if layout == "flat":
        arrays.append(mx.arange(3, dtype=mx.float32) + 3000)  # 123 elements: padded to a multiple of n
    spec = spec_from_mlx({f"p{i}": a for i, a in enumerate(arrays)})
    for size in (0, 64, 2**20):
        plan = plan_shards(plan_buckets(spec, size), n, layout)
        for b in range(plan.buckets.num_buckets):
            matrix = bucket_matrix(arrays, plan, b)
            assert matrix.shape == (n, int(plan.bucket_chunk_elems[b]))
            for k in range(n):
                np.testing.assert_array_equal(np.array(matrix[k]), np.array(bucket_row(arrays, plan, k, b)))


@pytest.mark.parametrize("knobs,message", [
    (dict(max_norm=0.0), r"max_norm must be None \(no clipping\) or a number > 0 .* got 0.0"),
    (dict(max_norm=-1.0), r"max_norm must be .* got -1.0"),
    (dict(max_norm=float("nan")), r"max_norm must be .* got nan"),
    (dict(max_norm=True), r"max_norm must be .* got True"),
    (dict(max_norm=float("-inf")), r"max_norm must be .* got -inf"),
    (dict(communication_size=float("nan")), r"communication_size must be a whole number of bytes .* got nan"),
    (dict(communication_size="32MB"), r"communication_size must be a whole number of bytes .* got '32MB'"),
])
def test_step_knobs_that_would_corrupt_the_update_are_refused_naming_them(knobs, message):
    """Issue 14, item 10: 0 applied no update, a negative max_norm climbed, NaN poisoned every parameter."""
    from workbench.adapters.mlx.fsdp import ddp_apply_gradients

    params = {"w": mx.ones((4, 2))}
    grads = {"w": mx.ones((4, 2))}
    for step in (fsdp_apply_gradients, ddp_apply_gradients):
        with pytest.raises(ValueError, match=message):
            step(grads, params, optim.SGD(learning_rate=0.1), **knobs)
    # inf is the runs' way to ask for the norm without clipping: accepted, and nothing is scaled
    new, norm = fsdp_apply_gradients(grads, params, optim.SGD(learning_rate=0.1), max_norm=float("inf"))
    assert np.allclose(np.array(new["w"]), 0.9) and abs(norm.item() - 8 ** 0.5) < 1e-6


def test_the_row_layout_error_suggests_only_what_the_step_takes(ring_run):
    """The planner's hint named its own pad_rows=True, which fsdp_apply_gradients does not take."""
    _, ranks = ring_run
    for rank in ranks:
        error = next(res["error"] for res in rank["results"] if "error" in res)
        assert "layout='flat'; this step has no pad_rows" in error and "pad_rows=True" not in error, error

"""MLX's own ``fully_shard`` (mlx >= 0.32.1): the wrapping plan, readiness and migration note (one process,
pure), and on real ring and MPI ranks the ``sum_scatter`` shim, the bounded pre-run check, and fidelity to DDP
and to the workbench's ZeRO-3 (rank program: tests/ranks_fully_shard.py)."""

import json
import shutil
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.nn.layers.distributed as mlx_distributed
import numpy as np
import pytest

from workbench.adapters.mlx.fully_shard import PROBE_TIMEOUT_EXIT, check_sum_scatter, supply_sum_scatter
from workbench.core.buckets import plan_buckets
from workbench.core.fully_shard_migration import MLX_FSDP_APIS, migration_note
from workbench.core.fully_shard_plan import check_fully_shard, plan_fully_shard, propose_units
from workbench.core.hf_config import spec_from_hf_config
from workbench.core.presets import get_preset
from workbench.core.specs import ModelSpec
from workbench.core.units import MiB
from workbench.launch.plan import plan_launch
from workbench.launch.local_run import LaunchError, run_local
from workbench.strategies import StepShape, get_strategy

RANKS = Path(__file__).parent / "ranks_fully_shard.py"
CONFIGS = Path(__file__).parent / "data" / "hf_configs"
MLX_ERROR = {"ring": "[ring] sum_scatter not supported.", "mpi": "[mpi] sum_scatter not yet implemented."}
STEPS = 2  # the rank program's steps per case
LM_PARAMS = 5328  # the rank program's SMALL LM: 2 blocks of 2080 + 1168 in the root
MLP_PARAMS = 20_576  # examples.tiny_mlp_lm


# ----------------------------------------------------------------------------- the plan (pure)


def test_units_are_the_blocks_plus_the_root_and_tile_the_model():
    spec = get_preset("qwen3-4b")
    plan = plan_fully_shard(spec, 8)
    assert plan.wrap_order == [f"model.layers.{i}" for i in range(36)] + ["root"]
    assert sorted(p for u in plan.units for p in u.paths) == sorted(spec.paths)  # each parameter in one unit
    assert sum(u.param_bytes for u in plan.units) == spec.nbytes
    root = plan.units[-1]
    assert set(root.paths) == {"model.embed_tokens.weight", "model.norm.weight"}  # tied head: no lm_head
    assert plan.largest_unit is root and root.gathered_bytes == (151936 * 2560 + 2560) * 2
    s = plan.summary()
    assert s["num_all_gathers"] == s["num_reduce_scatters"] == 37
    assert s["resident_gathered_bytes"] == spec.nbytes  # every unit's weights, forward to backward
    assert s["all_gather_bytes_sent"] == spec.nbytes * 7 // 8 and s["num_refusals"] == 0
    gpt2 = spec_from_hf_config(CONFIGS / "gpt2.json", dtype="float32")
    assert propose_units(gpt2) == [f"transformer.h.{i}" for i in range(12)]  # GPT-2's blocks are `h`
    blocks = ModelSpec.from_shapes({"blocks.0.w": (4, 4), "blocks.1.w": (4, 4), "out.w": (4, 4)})
    assert propose_units(blocks) == ["blocks.0", "blocks.1"]


def test_named_units_nest_innermost_first_and_compute_dtype_and_microbatches_count():
    spec = get_preset("tiny-llama", "float32")
    plan = plan_fully_shard(spec, 2, units=["model.layers.0", "model.layers.0.mlp"], compute_dtype="bf16",
                            num_microbatches=3, calls_per_step={"model.layers.0": 2})
    assert plan.wrap_order == ["model.layers.0.mlp", "model.layers.0", "root"]
    mlp, block, root = plan.units
    assert all(p.startswith("model.layers.0.mlp.") for p in mlp.paths)
    assert not any(p.startswith("model.layers.0.mlp.") for p in block.paths)
    assert "model.layers.1.mlp.up_proj.weight" in root.paths  # an unnamed block stays with the root
    assert (mlp.num_all_gathers, block.num_all_gathers, root.num_reduce_scatters) == (3, 6, 3)
    assert block.gathered_dtype == "bfloat16" and block.gathered_bytes == block.num_params * 2
    assert block.param_bytes == block.num_params * 4  # stored as float32, gathered as bfloat16
    mixed = ModelSpec.from_shapes({"a.w": ((4, 4), "bfloat16"), "a.n": ((4,), "float16")})
    assert plan_fully_shard(mixed, 2).units[0].gathered_dtype == "float32"  # what mx.concatenate promotes to
    assert plan_fully_shard(spec, 1).summary()["num_all_gathers"] == 0  # fully_shard over one rank: no-op


@pytest.mark.parametrize("units, match", [
    (["model.layers.9"], r"'model.layers.9' is not a module of 'tiny-llama'; modules there: \['model.layers.0', 'model.layers.1'\]"),
    (["model.norm.weight"], "'model.norm.weight' is a parameter, not a module; a unit is a module path such as 'model.norm'"),
    (["model.layers.0", "model.layers.0"], "distinct"),
    (["root"], "'root' is always a unit"),
])
def test_bad_units_are_refused_by_name(units, match):
    with pytest.raises(ValueError, match=match):
        plan_fully_shard(get_preset("tiny-llama"), 2, units=units)


def test_readiness_lists_every_indivisible_parameter_of_published_configs():
    gpt2 = spec_from_hf_config(CONFIGS / "gpt2.json", dtype="float32")
    [wte] = check_fully_shard(gpt2, 2)  # vocabulary 50257 is odd; every other axis 0 is even
    assert (wte.path, wte.unit, wte.shape) == ("transformer.wte.weight", "root", (50257, 768))
    assert wte.message == ("Cannot shard parameter 'transformer.wte.weight' with shape (50257, 768) across 2 devices: "
                           "axis 0 must be divisible by 2.")  # MLX's wording, full path
    assert [r.path for r in check_fully_shard(gpt2, 3)] == ["transformer.wte.weight", "transformer.wpe.weight"]
    assert len(check_fully_shard(gpt2, 7)) == len(gpt2) == 148  # 768, 1024, 2304, 3072 and 50257: none divisible by 7
    qwen = spec_from_hf_config(CONFIGS / "qwen2_5_0_5b.json")
    assert len(check_fully_shard(qwen, 3)) == len(qwen) == 290  # 896, 128, 4864, 151936: none divisible by 3
    refused = check_fully_shard(qwen, 7)  # 896 = 7 x 128 is; 128 (2 KV heads), 4864 and 151936 are not
    assert (refused[0].path, refused[0].shape) == ("model.embed_tokens.weight", (151936, 896))
    assert [r.path.split(".", 3)[3] for r in refused if r.unit == "model.layers.0"] == [
        "self_attn.k_proj.weight", "self_attn.k_proj.bias", "self_attn.v_proj.weight", "self_attn.v_proj.bias",
        "mlp.gate_proj.weight", "mlp.up_proj.weight"]
    assert len(refused) == 1 + 24 * 6 and plan_fully_shard(qwen, 7).summary()["num_refusals"] == len(refused)
    assert check_fully_shard(qwen, 2) == [] and check_fully_shard(gpt2, 1) == []


def test_readiness_names_scalars_and_quantized_layers():
    spec = ModelSpec.from_shapes({"scale": (), "q.weight": ((64, 8), "uint32"), "q.scales": (64, 2), "q.biases": (64, 2),
                                  "ids": ((4,), "int32"), "w": (4, 3)})
    refused = {r.path: r for r in check_fully_shard(spec, 2)}
    assert set(refused) == {"scale", "q.weight", "ids"}  # the scales fail with their layer, not listed again
    assert refused["scale"].message == "Cannot shard parameter 'scale' because it is a scalar."  # MLX's wording
    assert refused["q.weight"].reason == "quantized" and "keep 'q' out of every unit" in refused["q.weight"].message
    assert refused["ids"].reason == "integer" and "int32" in refused["ids"].message


# ----------------------------------------------------------------------------- the migration note (pure)


def test_migration_note_says_what_each_setting_becomes():
    note = migration_note({"communication_size": 8 * MiB, "dp_group": "dp", "max_norm": 1.0, "layout": "flat"})
    by = {r.knob: r for r in note.records}
    assert note.gone == ["dp_group", "communication_size", "layout"]
    assert by["max_norm"].status == "replaced" and "clip_grad_norm_sharded(grads, max_norm=1.0" in by["max_norm"].instead
    assert "average_gradients(grads, group=dp_group)" in by["dp_group"].instead
    assert by["fsdp_group"].status == "same" and by["communication_stream"].status == "default"
    assert "- `max_norm=1.0` (replaced): " in note.text
    quiet = migration_note({})
    assert quiet.gone == [] and {r.status for r in quiet.records} <= {"same", "default", "replaced"}
    with pytest.raises(ValueError, match=r"Unknown fsdp_apply_gradients setting\(s\) \['bucket_mb'\]"):
        migration_note({"bucket_mb": 25})
    with pytest.raises(ValueError, match="communication_size must be a whole number of bytes"):
        migration_note({"communication_size": "32MB"})


def test_migration_note_counts_collectives_on_both_sides():
    spec = get_preset("qwen3-4b")
    note = migration_note({"communication_size": 8 * MiB}, spec=spec, num_shards=8)
    text = {r.knob: r.instead for r in note.records}["communication_size"]
    b = plan_buckets(spec, 8 * MiB).num_buckets
    assert f"{b} bucket(s) under 8.00 MiB gave {b} reduce-scatter(s)" in text
    assert "gives 37 of each, the largest 'root' at 741.88 MiB" in text  # 36 blocks + root; the embedding
    gpt2 = spec_from_hf_config(CONFIGS / "gpt2.json", dtype="float32")
    layout = migration_note({"layout": "flat"}, spec=gpt2, num_shards=3).records[5]
    assert layout.knob == "layout" and layout.status == "gone"
    assert layout.instead.endswith("Here 2 of 148 parameters of 'gpt2' would be refused over 3 ranks.")


def test_the_api_table_matches_the_installed_mlx():
    version = tuple(int(x) for x in mx.__version__.split(".")[:3])
    for name, (first, last) in MLX_FSDP_APIS.items():
        where = nn.utils if name == "clip_grad_norm_sharded" else nn
        shipped = tuple(int(x) for x in first.split(".")) <= version[:len(first.split("."))] and \
            (last is None or version <= tuple(int(x) for x in last.split(".")))
        assert hasattr(where, name) == shipped, (name, mx.__version__)


# ----------------------------------------------------------------------------- one process: the shim's no-op


def test_the_trainer_over_one_rank_is_a_plain_step_and_refuses_deferred_sync():
    import mlx.optimizers as optim
    from mlx.utils import tree_flatten

    from workbench.adapters.mlx.fully_shard_trainer import FullyShardTrainer
    from workbench.models.mlx_lm import lm_loss
    from programs.mlx_zero3_check import SMALL, batch, build

    plain, opt = build(SMALL), optim.SGD(0.5)
    trainer = FullyShardTrainer(build(SMALL), optim.SGD(0.5), max_norm=1.0, num_microbatches=2)
    for step in range(2):
        x, y = batch(SMALL, step, 0, 1)
        grads, _ = optim.clip_grad_norm(nn.value_and_grad(plain, lm_loss)(plain, x, y)[1], 1.0)
        opt.update(plain, grads)
        trainer.step(lm_loss, x, y)
    assert_allclose({k: np.array(v) for k, v in trainer.full_parameters().items()},
                    {k: np.array(v) for k, v in tree_flatten(plain.parameters())}, 1e-5, 1e-6)
    assert trainer.report["num_all_gathers"] == 0 and trainer.report["reduce_scatter_transport"] == "sum_scatter"
    with pytest.raises(ValueError, match="defer_sync=True: MLX's fully_shard reduce-scatters in every backward"):
        FullyShardTrainer(build(SMALL), optim.SGD(0.5), num_microbatches=2, defer_sync=True)


def test_a_group_of_one_needs_no_sum_scatter_and_changes_nothing():
    group = mx.distributed.init()  # no backend: one rank
    with supply_sum_scatter(group) as supply:
        assert mlx_distributed.mx is mx and not supply.supplied
    assert check_sum_scatter(group) == "none needed"


# ----------------------------------------------------------------------------- real ranks


def launch(n: int, backend: str, out: Path, parts: str, timeout_s: float = 300) -> list[dict]:
    run_local(plan_launch(n, framework="mlx", backend=backend), [str(RANKS), "--out", str(out), "--parts", parts],
              timeout_s=timeout_s, workdir=out / "logs")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]


RUNS = [("ring", 2), ("ring", 4), ("mpi", 4)]


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """One launch per backend and N, all parts in it, shared by the tests (memory on the 2-rank ring only)."""
    done = {}

    def get(backend: str, n: int) -> list[dict]:
        if backend == "mpi" and shutil.which("mpirun") is None:
            pytest.skip("OpenMPI's mpirun is not installed (scripts/test.sh installs Debian's openmpi-bin where it can)")
        if (backend, n) not in done:
            parts = "scope,fidelity,zero3,readiness,unguarded" + (",memory" if (backend, n) == ("ring", 2) else "")
            done[backend, n] = launch(n, backend, tmp_path_factory.mktemp(f"fully-shard-{backend}-{n}"), parts)
        return done[backend, n]
    return get


@pytest.fixture(params=RUNS, ids=[f"{b}-{n}" for b, n in RUNS])
def ranks(request, launched):
    return launched(*request.param)


def test_without_the_shim_the_check_fails_on_every_rank_naming_sum_scatter_and_the_backend(ranks):
    backend = ranks[0]["backend"]
    mlx_error = MLX_ERROR[backend]
    for rank in ranks:
        scope = rank["scope"]
        assert scope["check_backend"] == backend and scope["check_s"] < 60  # its bound (timeout_s)
        assert scope["check_without_shim"].startswith(
            f"MLX's fully_shard reduce-scatters gradients with mx.distributed.sum_scatter in backward, and the "
            f"{backend} backend has none ({mlx_error}); run the step inside "
            f"workbench.adapters.mlx.fully_shard.supply_sum_scatter(group)")
        assert rank["unguarded"]["error"] == mlx_error  # unchecked: the step itself raises (mlx 0.32.4, Linux)


def test_the_shim_rebinds_one_module_name_for_the_block_only(ranks):
    for rank in ranks:
        scope = rank["scope"]
        # inside: fully_shard's module sees the supplied collective; mlx.core, and so any direct call, does not
        assert scope["inside"] == {"module_mx_is_core": False, "core_sum_scatter_unchanged": True, "check": "supplied",
                                   "direct_call": MLX_ERROR[rank["backend"]]}
        assert scope["after"] == {"module_mx_is_core": True, "has_sum_scatter": False}  # the probe's cache kept
        assert scope["after_error_module_mx_is_core"] is True
        n = rank["size"]
        assert scope["supply"]["supplied"] and scope["supply"]["transport"] == \
            ("all_gather exchange" if n == 2 else "send/recv")


def assert_allclose(got: dict, want: dict, rtol: float, atol: float | None = None):
    """``allclose`` per array: ``atol`` absolute, else ``rtol`` times the array's largest magnitude."""
    assert set(got) == set(want) and want
    for path, w in want.items():
        w, g = np.asarray(w), np.asarray(got[path])
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol if atol is not None else rtol * np.abs(w).max(),
                                   err_msg=path)


def test_fully_shard_with_the_shim_equals_ddp(ranks):
    """MLX's tolerances: fp32 ``allclose`` (rtol 1e-5, MLX's default, atol 1e-6) for the first step's gradients
    and SGD's parameters after 2 steps (with clipping: clip_grad_norm_sharded against clip_grad_norm); AdamW
    divides by sqrt(v), so its parameters compare relative to each array's largest magnitude (measured: 1.8e-6
    absolute on 0.35 at 4 MPI ranks after 3 steps). bf16: the first step's gradients within 2 bf16 ulps of the largest
    magnitude (measured 1 ulp at 4 ranks: the ring adds in another order); its parameters drift apart in
    bf16 updates and are not compared."""
    for rank in ranks:
        f = rank["fidelity"]
        for case in ("lm_float32", "lm_adamw", "user_factory"):
            fs, ddp = f[case]["fully_shard"], f[case]["ddp"]
            assert fs["supplied"]
            assert_allclose(fs["grads"], ddp["grads"], 1e-5, 1e-6)
            np.testing.assert_allclose(fs["losses"], ddp["losses"], rtol=1e-6)
            assert_allclose(fs["params"], ddp["params"], 1e-5, None if case == "lm_adamw" else 1e-6)
        np.testing.assert_allclose(f["lm_float32"]["fully_shard"]["norms"], f["lm_float32"]["ddp"]["norms"], rtol=1e-6)
        bf16 = f["lm_bfloat16"]
        assert_allclose(bf16["fully_shard"]["grads"], bf16["ddp"]["grads"], 2 * 2**-8)
        assert bf16["fully_shard"]["losses"][0] == bf16["ddp"]["losses"][0]  # same weights, gathered
        assert f["user_factory"]["fully_shard"]["params"] == ranks[0]["fidelity"]["user_factory"]["fully_shard"]["params"]


def test_the_trainer_with_micro_batches_equals_ddp_and_reports_its_collectives(ranks):
    """FullyShardTrainer (the interface a run's rank program drives), 2 micro-batches of the same batches as
    the fp32 DDP case with clipping: same parameters within fp32 allclose (micro-batch sums in another order)."""
    for rank in ranks:
        n, f = rank["size"], rank["fidelity"]
        t, ddp = f["trainer"], f["lm_float32"]["ddp"]
        assert_allclose(t["params"], ddp["params"], 1e-5, 1e-6)
        np.testing.assert_allclose(t["losses"], ddp["losses"], rtol=1e-6)
        np.testing.assert_allclose(t["norms"], ddp["norms"], rtol=1e-6)
        assert t["report"] == {
            "strategy": "mlx-fully-shard", "num_microbatches": 2, "defer_sync": False, "num_units": 3,
            "num_all_gathers": 6, "num_reduce_scatters": 6, "num_supplied_reduce_scatters": 6, "num_all_sums": 1,
            "reduce_scatter_transport": "ring", "ring_transport": "all_gather exchange" if n == 2 else "send/recv",
            "all_gather_bytes_sent": 2 * 4 * LM_PARAMS * (n - 1) // n,
            "reduce_scatter_bytes_sent": 2 * 4 * LM_PARAMS * (n - 1) // n}


def test_collectives_and_optimizer_state_follow_the_plan(ranks):
    for rank in ranks:
        n, f = rank["size"], rank["fidelity"]
        assert f["plan_lm"]["num_units"] == f["plan_mlp"]["num_units"] == 3  # 2 blocks + root; fc1, fc2 + root
        for case in ("lm_float32", "lm_adamw", "user_factory"):
            fs = f[case]["fully_shard"]
            u = 3
            assert fs["num_supplied"] == [u] * len(fs["losses"]) == [u, u]  # one reduce-scatter per unit per step, all supplied
            for counts in fs["counts"]:
                clip = 1 if case == "lm_float32" else 0
                want = {"all_gather": u + u} if n == 2 else {"all_gather": u, "send": (n - 1) * u, "recv_like": (n - 1) * u}
                assert counts == {**want, **({"all_sum": 1} if clip else {})}  # never MLX's sum_scatter
        assert f["lm_float32"]["fully_shard"]["state_elems"] * n == LM_PARAMS  # SGD's v: this rank's 1/N
        assert f["lm_adamw"]["fully_shard"]["state_elems"] * n == 2 * LM_PARAMS  # AdamW's m and v
        assert f["user_factory"]["fully_shard"]["state_elems"] * n == MLP_PARAMS


def spied(counts: dict[str, int], n: int) -> dict[str, int]:
    """The record's collectives as the spy sees them on ring and MPI ranks: a gather is an ``all_gather``; a
    reduce-scatter, supplied by the workbench ring, one ``all_gather`` exchange at 2 ranks, else N - 1 send and
    recv_like hops (transport.ring_reduce_scatter); the norm's all-reduce an ``all_sum``."""
    gathers, scatters, sums = counts["all_gather"], counts["reduce_scatter"], counts["all_reduce"]
    out = {"all_gather": gathers + scatters} if n == 2 else \
        {"all_gather": gathers, "send": (n - 1) * scatters, "recv_like": (n - 1) * scatters}
    return {**out, **({"all_sum": sums} if sums else {})}


def test_the_records_collectives_are_those_fully_shard_issues(ranks):
    """strategies.fully_shard's step_collectives against the spy: every unit gathered once per micro-batch and kept
    to backward (never gathered again), reduce-scattered once per micro-batch; G = 1 in the user's loop, G = 2
    micro-batches (each syncing) in FullyShardTrainer; the norm's all-reduce with clipping."""
    record = get_strategy("mlx-fully-shard")
    for rank in ranks:
        n, f = rank["size"], rank["fidelity"]
        for case, plan, clip in (("lm_float32", "plan_lm", True), ("lm_adamw", "plan_lm", False),
                                 ("user_factory", "plan_mlp", False)):
            shape = StepShape(num_ranks=n, sync_bytes=(1.0,) * f[plan]["num_units"], reduces_norm=clip)
            assert f[case]["fully_shard"]["counts"] == [spied(record.collective_counts(shape), n)] * STEPS, case
        shape = StepShape(num_ranks=n, sync_bytes=(1.0,) * f["plan_lm"]["num_units"], num_microbatches=2,
                          defer_sync=False, reduces_norm=True)
        assert record.collective_counts(shape)["all_gather"] == 2 * f["plan_lm"]["num_units"]
        assert f["trainer"]["counts"] == [spied(record.collective_counts(shape), n)] * STEPS


def test_zero3_gradients_equal_fully_shards(ranks):
    for rank in ranks:
        z = rank["zero3"]
        assert len(z["ours"]) == 2 * 8 + 4  # every parameter: the blocks' and the root's
        assert_allclose(z["ours"], z["theirs"], 1e-6, 1e-7)


def test_readiness_lists_what_mlx_refuses_and_what_it_lets_through(ranks):
    for rank in ranks:
        n, r = rank["size"], rank["readiness"]
        lines = r["listed"].splitlines()
        assert lines[0] == f"fully_shard over {n} ranks would refuse {len(lines) - 1} parameter(s):"
        assert r["untouched"]  # refused before any module was wrapped
        # MLX raises on the first parameter of the block only, in its own words, relative to the block.
        assert lines[1].replace("'layers.0.", "'") == r["mlx_block"]
        assert f"Cannot shard parameter 'norm.weight' with shape (5,) across {n} devices" in r["listed"]
        assert "'layers.0.weight' with shape (64, 8): it is the packed uint32 weight" in r["listed_quantized"]
        assert r["mlx_quantized"] == "[quantized_matmul] The weight matrix should be uint32 but received float32"


def test_memory_at_rest_is_one_nth_and_gathered_weights_stay_to_backward(launched):
    for rank in launched("ring", 2):
        m, plan = rank["memory"], rank["memory"]["plan"]
        # at rest: this rank's rows of the parameters and AdamW's m and v
        assert m["fully_shard"]["rest_bytes"] == pytest.approx(3 * plan["shard_bytes"], rel=0.02)
        assert m["ddp"]["rest_bytes"] == pytest.approx(3 * 2 * plan["shard_bytes"], rel=0.02)
        # every unit's gathered weights are held from forward to backward: the peak lies above rest by more
        assert m["fully_shard"]["peak_bytes"] - m["fully_shard"]["rest_bytes"] > plan["resident_gathered_bytes"]
        assert m["fully_shard_bf16"]["peak_bytes"] < m["fully_shard"]["peak_bytes"] < m["ddp"]["peak_bytes"]


def test_a_probe_that_cannot_return_ends_the_rank_within_its_bound(tmp_path):
    """The check's watchdog, on a real hang: rank 0 probes inside the shim, rank 1 never joins the exchange."""
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(2, "ring", tmp_path, "stuck", timeout_s=120)
    assert info.value.rank == 0 and f"exited with code {PROBE_TIMEOUT_EXIT}" in str(info.value)
    assert ("SumScatterMissing: rank 0: the sum_scatter probe on the ring backend did not return within 3 s "
            "(the workbench ring supplied for it waits for a rank that did not take part") in str(info.value)
    assert time.monotonic() - start < 60  # rank 1 sleeps 60 s: rank 0's watchdog ended the run

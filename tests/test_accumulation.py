"""The collective and byte model of gradient accumulation (checked against real runs in test_training)."""

import pytest

from workbench.runs.spec import RunSpec
from workbench.studies.accumulation import accumulation_specs, expected_bytes, expected_collectives

MODEL = dict(vocab_size=32, seq_len=16, dim=32, num_layers=2, num_heads=2, mlp_dim=64)


def spec(**kw):
    return RunSpec(**{"framework": "mlx", "num_ranks": 2, "steps": 1, "global_batch": 16, "model": MODEL,
                      "communication_size": 2**20, **kw})


def test_the_sweep_has_one_g1_run_and_both_modes_of_every_larger_g():
    specs = accumulation_specs(dict(num_ranks=2, global_batch=16, model=MODEL), frameworks=["mlx", "jax"],
                               strategies=["ddp", "fsdp-full"], microbatches=[1, 2, 8])
    assert len(specs) == 2 * 2 * 5
    assert {(s.num_microbatches, s.defer_sync) for s in specs} == {(1, True), (2, True), (2, False), (8, True), (8, False)}


@pytest.mark.parametrize("g", [2, 4, 8])
def test_every_micro_batch_multiplies_the_gradient_collectives_by_g(g):
    one = {s: expected_collectives(spec(strategy=s)) for s in ("ddp", "fsdp-row", "fsdp-full")}
    every = {s: expected_collectives(spec(strategy=s, num_microbatches=g, defer_sync=False)) for s in one}
    deferred = {s: expected_collectives(spec(strategy=s, num_microbatches=g)) for s in one}
    assert one["ddp"] == {"all_reduce": 1, "reduce_scatter": 0, "all_gather": 0}  # one 1 MiB bucket
    assert every["ddp"]["all_reduce"] == g and deferred["ddp"] == one["ddp"]
    assert one["fsdp-row"] == {"all_reduce": 1, "reduce_scatter": 1, "all_gather": 1}  # + the norm's all-reduce
    assert every["fsdp-row"] == {**one["fsdp-row"], "reduce_scatter": g} and deferred["fsdp-row"] == one["fsdp-row"]
    # MLX full sharding: 2 blocks + the root; blocks are gathered again for backward.
    assert one["fsdp-full"] == {"all_reduce": 1, "reduce_scatter": 3, "all_gather": 5}
    assert every["fsdp-full"] == {"all_reduce": 1, "reduce_scatter": 3 * g, "all_gather": 5 * g}
    assert deferred["fsdp-full"] == {"all_reduce": 1, "reduce_scatter": 3, "all_gather": 3}  # gathered once


def test_bytes_follow_the_ring_formulas():
    total = 4 * (32 * 32 + 16 * 32 + 2 * (2 * 32 + 4 * 32 * 32 + 2 * 64 * 32) + 32 + 32 * 32)  # fp32 LM bytes
    s = spec(strategy="ddp")
    from workbench.runs.estimate import run_model_spec

    assert run_model_spec(s.to_dict()).nbytes == total
    assert expected_bytes(s) == total  # all-reduce: 2 (N-1)/N, N = 2
    assert expected_bytes(spec(strategy="ddp", num_microbatches=4, defer_sync=False)) == 4 * total
    assert expected_bytes(spec(strategy="fsdp-row")) == total  # reduce-scatter + all-gather, (N-1)/N each
    assert expected_bytes(spec(strategy="fsdp-row", num_microbatches=4, defer_sync=False)) == total * 5 // 2
    assert expected_bytes(spec(strategy="fsdp-full", num_microbatches=4)) == total  # gathered once, scattered once


def test_jax_counts_its_own_units_and_one_all_reduce_per_array():
    jax_ddp = expected_collectives(spec(framework="jax", strategy="ddp", num_microbatches=2, defer_sync=False))
    assert jax_ddp["all_reduce"] == 2 * (4 + 2 * 8)  # embeddings (2), final norm, head + 8 arrays per block
    jax_full = expected_collectives(spec(framework="jax", strategy="fsdp-full"))
    assert jax_full == {"all_reduce": 0, "reduce_scatter": 4, "all_gather": 8}  # embed, 2 blocks, head; each twice


def test_a_single_rank_issues_no_collectives():
    assert expected_collectives(spec(num_ranks=1, strategy="fsdp-full")) == dict.fromkeys(
        ("all_reduce", "reduce_scatter", "all_gather"), 0)


def test_the_model_table_names_each_mode_and_the_phase_that_sets_the_peak():
    from workbench.studies.accumulation import accumulation_model_table

    specs = accumulation_specs(dict(num_ranks=2, global_batch=16, model=MODEL), frameworks=["mlx"],
                               strategies=["fsdp-row", "fsdp-full"], microbatches=[1, 4])
    t = accumulation_model_table(specs).set_index(["strategy", "mode"])
    assert t.loc[("fsdp-row", "G = 1"), "accumulator MiB"] == 0
    assert t.loc[("fsdp-row", "deferred"), "accumulator MiB"] == 2 * t.loc[("fsdp-row", "every micro-batch"), "accumulator MiB"]
    assert t.loc[("fsdp-full", "deferred"), "accumulator MiB"] == 2 * t.loc[("fsdp-full", "every micro-batch"), "accumulator MiB"]
    assert set(t["peak set by"]) <= {"step", "backward"}
    assert (t.reduce_scatter.loc["fsdp-full"].to_numpy() == [3, 3, 12]).all()  # G=1, deferred, every micro-batch


def test_a_spec_with_a_bad_field_is_refused_by_name():
    with pytest.raises(ValueError, match="strategy"):
        expected_collectives(dict(framework="mlx", strategy="fsdp-rows", model=MODEL))


def test_jax_full_sharding_with_tied_embeddings_is_one_unit():
    tied = expected_collectives(spec(framework="jax", strategy="fsdp-full", model={**MODEL, "tie_embeddings": True}))
    assert tied == {"all_reduce": 0, "reduce_scatter": 1, "all_gather": 2}  # train_jax.lm_units: one unit, gathered twice

"""A model's profile in one process (issue 26): the line fitted to it, its cache key, its record on disk (a
corrupt one is named and kept), and the run estimate made from it."""

import json
import time

import pytest

from workbench.estimate.profile_fit import fit_from_dict, fit_linear
from workbench.launch.plan import thread_env
from workbench.launch.profile import default_micro_batch_sizes, merge_co_runners, profile_model
from workbench.ranks.profile_probe import busy_until_peers_done, high_water_mark_resets, rss_above, wait_for_peers
from workbench.runs.estimate import estimate_run_memory
from workbench.runs.profile import (
    PROFILE_VERSION,
    ProfileError,
    load_profile,
    profile_from_measurements,
    profile_key,
    profile_key_fields,
    profile_path,
    save_profile,
)
from workbench.runs.profile_estimate import estimate_with_profile
from workbench.runs.spec import RunSpec
from workbench.runs.tables import load_runs

LM = dict(vocab_size=64, seq_len=32, dim=64, num_layers=2, num_heads=4, mlp_dim=128)


def measured(**kw):
    """What a profiling program writes, for a model whose activations are 1000 + 5000 b bytes."""
    return {"micro_batch_sizes": [2, 4, 8], "activation_samples": [[11_000, 10_900], [21_000, 20_000], [41_000, 41_000]],
            "compute_s_samples": [[0.2, 0.4, 0.3], [0.5, 0.5, 0.6], [1.0, 0.9, 1.1]], "parameter_bytes": 4000,
            "gradient_bytes": 4000, "optimizer_state_bytes": 8000, "update_s": 0.002, "truth_source": "test",
            "plan_activation_bytes": None, "peak_rss_bytes": 10**8, "peak_array_bytes": 10**6, "versions": {}, **kw}


def test_the_fit_is_the_least_squares_line_and_keeps_its_residual():
    two = fit_linear([2, 4], [10.0, 20.0])
    assert (two.intercept, two.slope, two.max_residual, two.num_points) == (0.0, 5.0, 0.0, 2)
    three = fit_linear([1, 2, 3], [1.0, 3.0, 2.0])  # the least-squares line is 1 + 0.5 x
    assert three.intercept == pytest.approx(1.0) and three.slope == pytest.approx(0.5)
    assert three.max_residual == pytest.approx(1.0) and three.at(4) == pytest.approx(3.0)
    assert three.extrapolates(4) and not three.extrapolates(2.5)
    assert fit_from_dict(three.to_dict(), what="x") == three
    with pytest.raises(ValueError, match="activation_bytes: a line needs two or more distinct micro-batch sizes"):
        fit_linear([4, 4], [1.0, 2.0], what="activation_bytes")
    with pytest.raises(ValueError, match="compute_s: 1 values for 2 micro-batch sizes"):
        fit_linear([1, 2], [1.0], what="compute_s")
    with pytest.raises(ValueError, match="finite"):
        fit_linear([1, 2], [1.0, float("nan")])


def test_a_profile_fits_the_largest_activation_and_the_median_seconds_of_each_size():
    profile = profile_from_measurements(measured(), {"framework": "mlx"}, cost_s=3.5)
    assert profile.activation_fit.slope == pytest.approx(5000) and profile.activation_fit.intercept == pytest.approx(1000)
    assert profile.activation_bytes_at(16) == 81_000 and profile.activation_fit.max_residual == pytest.approx(0, abs=1e-6)
    assert profile.compute_s_at(8) == pytest.approx(1.0, abs=0.05) and profile.update_s_per_param_byte == 0.002 / 4000
    assert (profile.cost_s, profile.cost_peak_rss_bytes) == (3.5, 10**8)


def test_the_cache_key_follows_everything_the_measurement_depends_on():
    base = RunSpec(model=LM)
    fields = profile_key_fields(base, threads=1)
    assert fields["model"] == {"lm": LM} and fields["threads"] == 1 and fields["framework_version"]
    assert profile_key(fields) == profile_key(profile_key_fields(RunSpec(model=LM), threads=1))
    # the strategy, ranks and batch are not the model's: one profile serves them all
    assert profile_key(fields) == profile_key(profile_key_fields(RunSpec(model=LM, strategy="fsdp-row", num_ranks=4,
                                                                         global_batch=32), threads=1))
    others = [profile_key_fields(base, threads=2), profile_key_fields(RunSpec(model=LM, precision="bfloat16"), 1),
              profile_key_fields(RunSpec(model={**LM, "seq_len": 64}), 1),
              profile_key_fields(RunSpec(model=LM, framework="jax"), 1),
              profile_key_fields(RunSpec(model=LM, optimizer="sgd"), 1)]
    assert len({profile_key(fields), *map(profile_key, others)}) == 6
    user = RunSpec(model_factory="examples.tiny_mlp_lm:mlx_factory", model=dict(vocab_size=256, seq_len=32))
    user_fields = profile_key_fields(user, 1)
    assert user_fields["model"] == {"factory": "examples.tiny_mlp_lm:mlx_factory",
                                    "source_sha256": user.model_source_sha256}
    assert profile_key(profile_key_fields({**user.to_dict(), "model_source_sha256": "0" * 64}, 1)) != profile_key(user_fields)
    path = profile_path("/runs", fields)
    assert path.parent.name == ".profiles" and path.name == f"mlx-{profile_key(fields)}.json"


def test_a_stored_profile_comes_back_equal_and_the_run_tables_pass_over_it(tmp_path):
    fields = profile_key_fields(RunSpec(model=LM), 1)
    profile = profile_from_measurements(measured(), fields, cost_s=2.0)
    path = save_profile(profile_path(tmp_path, fields), profile)
    assert load_profile(path) == profile
    assert load_runs(tmp_path).problems == []  # .profiles is no run


def test_a_profile_keeps_the_forward_alone_and_the_machines_cores_and_reads_one_stored_without_them(tmp_path):
    fields = profile_key_fields(RunSpec(model=LM), 1)
    timed = measured(forward_s_samples=[[0.1], [0.2], [0.4]], cores=2)  # forward: 0.05 s per sequence
    profile = profile_from_measurements(timed, fields, cost_s=2.0)
    assert profile.forward_s_at(16) == pytest.approx(0.8) and profile.cores == 2
    path = save_profile(profile_path(tmp_path, fields), profile)
    assert load_profile(path) == profile
    data = json.loads(path.read_text())
    data["forward_s_samples"][0] = [9.0]  # a sample changed, the stored forward fit not
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="stored fits are not the fits of its samples"):
        load_profile(path)
    for name in ("forward_s_samples", "forward_fit", "cores"):  # a profile stored before they were measured
        del data[name]
    path.write_text(json.dumps(data))
    older = load_profile(path)
    assert older.forward_fit is None and older.cores is None
    assert older.forward_s_at(8) == pytest.approx(older.compute_s_at(8) / 3)  # a backward is about two forwards


@pytest.mark.parametrize("text, why", [
    ("{not json", "cannot be read as JSON"),
    ('{"version": 99}', "not a profile of version " + str(PROFILE_VERSION)),
    ("[1, 2]", "not a profile of version " + str(PROFILE_VERSION)),
])
def test_a_corrupt_cache_file_is_an_error_naming_it_and_is_kept(tmp_path, text, why):
    spec = RunSpec(model=LM)
    path = profile_path(tmp_path, profile_key_fields(spec, int(thread_env(2)["OMP_NUM_THREADS"]), 2))
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(ProfileError, match=why) as err:
        profile_model(spec, tmp_path, ranks_per_host=2)  # the threads of 2 ranks on this host: this file's key
    assert str(path) in str(err.value) and "refresh=True" in str(err.value) and err.value.path == path
    assert path.read_text() == text  # not overwritten, not measured again


def test_an_edited_profile_is_refused_naming_what_no_longer_holds(tmp_path):
    fields = profile_key_fields(RunSpec(model=LM), 1)
    path = save_profile(profile_path(tmp_path, fields), profile_from_measurements(measured(), fields, cost_s=2.0))
    data = json.loads(path.read_text())
    data["activation_samples"][2] = [1, 1]  # a sample changed, the stored fit not
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="stored fits are not the fits of its samples"):
        load_profile(path)
    data = json.loads(path.read_text())
    del data["parameter_bytes"]
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="field is missing or malformed.*parameter_bytes"):
        load_profile(path)
    data["key_fields"]["threads"] = 7
    path.write_text(json.dumps({**data, "parameter_bytes": 4000}))
    with pytest.raises(ProfileError, match="not the hash of its key_fields"):
        load_profile(path)


def test_the_estimate_takes_the_profiles_activations_for_the_runs_micro_batch():
    spec = RunSpec(model_factory="examples.tiny_mlp_lm:mlx_factory", model=dict(vocab_size=256, seq_len=32),
                   global_batch=16, num_ranks=2)  # 8 sequences per rank
    shapes = [["embed.weight", [256, 32], "float32"], ["head.weight", [256, 32], "float32"]]
    profile = profile_from_measurements(measured(), profile_key_fields(spec, 1), cost_s=1.0)
    before, after = estimate_run_memory(spec, shapes), estimate_with_profile(spec, profile, shapes)
    assert after["activations"] == 41_000 and before["activations"] == 2 * 32 * 8 * 256 * 4  # the logits only
    assert [c.name for c in after.components] == [c.name for c in before.components]
    assert {c.name: c.rank_bytes for c in after.components if c.name != "activations"} == \
        {c.name: c.rank_bytes for c in before.components if c.name != "activations"}
    assert after.total_bytes == after.phase_bytes("states") + max(after.phase_bytes("step"), after.phase_bytes("backward"))
    assert "profiled" in next(c.formula for c in after.components if c.name == "activations")
    with pytest.raises(ValueError, match="another model, framework .*framework: 'mlx', not 'jax'"):
        estimate_with_profile(RunSpec(**{**spec.to_dict(), "framework": "jax",
                                         "model_factory": "examples.tiny_mlp_lm:jax_factory"}), profile, shapes)
    with pytest.raises(ValueError, match="seq_len"):
        estimate_with_profile(RunSpec(**{**spec.to_dict(), "model": dict(vocab_size=256, seq_len=16)}), profile, shapes)


def test_a_strategy_that_recomputes_blocks_scales_the_profiled_activations_by_the_formulas_ratio():
    ddp, full = RunSpec(model=LM, global_batch=16), RunSpec(model=LM, global_batch=16, strategy="fsdp-full")
    profile = profile_from_measurements(measured(), profile_key_fields(ddp, 1), cost_s=1.0)
    assert estimate_with_profile(ddp, profile)["activations"] == 41_000
    ratio = estimate_run_memory(full)["activations"] / estimate_run_memory(ddp)["activations"]
    assert ratio < 1 and estimate_with_profile(full, profile)["activations"] == round(41_000 * ratio)


def test_zero3_activations_are_the_profiled_step_on_one_rank_less_what_the_estimate_holds_beside_them(tmp_path):
    """MLX's fsdp-full wraps a model's blocks and recomputes each in backward. The profile measured the ZeRO-3
    trainer's step on a group of one: its rise, less the gradients and unit buffers the estimate holds on one rank,
    is the run's activations (mlx-lm's Llama and Qwen3 read 1.04 and 1.00 of it at 2 ranks, the attention example
    1.02; one lazy backward with every block recomputed grew 1.13-1.65x as much with the micro-batch). Every other run, a JAX run, and a
    profile without the measure keep the backward's."""
    user = dict(model=dict(vocab_size=384, seq_len=128), model_factory="examples.tiny_attention_lm:mlx_factory",
                global_batch=16, num_ranks=2)
    full, ddp = RunSpec(strategy="fsdp-full", **user), RunSpec(strategy="ddp", **user)
    jax = RunSpec(**{**full.to_dict(), "framework": "jax", "model_factory": "examples.tiny_attention_lm:jax_factory"})
    shapes = [["blocks.0.w", [64, 64], "float32"], ["blocks.1.w", [64, 64], "float32"], ["head.w", [64, 8], "float32"]]
    one = estimate_run_memory(RunSpec(**{**full.to_dict(), "num_ranks": 1, "global_batch": 8}), shapes)
    held = one["gradients"] + one["gathered_unit"]
    rises = [[held + 6_000, held + 5_000], [held + 11_000, held], [held + 21_000, held + 20_500]]  # held + 1000 + 2500 b
    profile = profile_from_measurements(measured(zero3_rise_samples=rises), profile_key_fields(full, 1), 1.0)
    assert profile.zero3_rise_fit.slope == pytest.approx(2500) and profile.zero3_rise_fit.at(8) == pytest.approx(held + 21_000)
    assert load_profile(save_profile(tmp_path / "p.json", profile)) == profile
    estimate = estimate_with_profile(full, profile, shapes)
    assert estimate["activations"] == 21_000 and "ZeRO-3 step on one rank" in next(
        c.formula for c in estimate.components if c.name == "activations")
    assert estimate_with_profile(ddp, profile, shapes)["activations"] == 41_000  # nothing recomputed: the backward's
    assert estimate_with_profile(full, profile_from_measurements(measured(), profile_key_fields(full, 1), 1.0),
                                 shapes)["activations"] == 41_000  # no ZeRO-3 measure: the backward's
    jax_profile = profile_from_measurements(measured(zero3_rise_samples=rises), profile_key_fields(jax, 1), 1.0)
    assert estimate_with_profile(jax, jax_profile, shapes)["activations"] == 41_000  # XLA gathers every unit at once
    # the blocks are the units: the gathered unit is the largest block's, not the whole model's
    whole = [[p.replace("blocks", "parts"), s, d] for p, s, d in shapes]  # no blocks: the model is one unit
    assert estimate_run_memory(full, shapes)["gathered_unit"] * 2 < estimate_run_memory(full, whole)["gathered_unit"]
    merged = merge_co_runners([measured(zero3_rise_samples=rises), measured(zero3_rise_samples=[[1], [2], [3]])])
    assert merged["zero3_rise_samples"][2] == [held + 21_000, held + 20_500, 3]
    with pytest.raises(ValueError, match="zero3_rise_samples need one row for each"):
        profile_from_measurements(measured(zero3_rise_samples=rises[:2]), profile_key_fields(full, 1), 1.0)


def test_mlxs_zero3_buffers_are_the_ring_exchanges_and_one_rank_holds_its_copy():
    """The gathered bucket and its rebuilt arrays (2 U; one rank's rows are copied once, its arrays views of the
    copy), the full gradient (U) and the reduce-scatter's buffers beside it: on one rank the rows concatenated and
    their scaled copy (2 U), at 2 ranks both rows, the exchanged pair, the sum and its scaled copy (3 U), above
    U (1 + 2 / N). The one-rank figure was 3 U, as at 2 ranks: the profile's activations, the one-rank step's rise
    less these buffers, came 1 U short, and the built-in LM's fsdp-full peak at 4 ranks read 2.20 MiB against 1.89
    predicted (2.01 now)."""
    from workbench.estimate.memory import estimate_memory, unit_reduce_scatter_bytes

    u = 1000
    assert [unit_reduce_scatter_bytes(4 * u, n) for n in (1, 2, 4, 8)] == [8000, 12000, 6000, 5000]
    for n, want in ((1, u * 4 * (1 + 1 + 2)), (2, u * 4 * (2 + 1 + 3)), (4, u * 4 * (2 + 1 + 1.5))):
        est = estimate_memory(5 * u // 2, "zero3", n, unit_buffers="mlx", units={"a": u, "b": u, "root": u // 2},
                              param_dtype="float32", master_dtype=None, optimizer_state_dtype="float32")
        assert est["gathered_unit"] == want, (n, est["gathered_unit"], want)


def test_jaxs_zero3_holds_the_whole_model_gathered_and_its_activations_whole():
    """XLA issues every unit's all-gather at once: on the validation LM at 2 ranks its plan was 66.3 MiB and the
    rank's VmHWM 77.5 MiB where per-unit gathers with recomputed blocks predicted 45.6 MiB (now 61.8 MiB)."""
    from workbench.runs.spec import VALIDATION_MODEL

    jax = RunSpec(framework="jax", strategy="fsdp-full", model=VALIDATION_MODEL, global_batch=8, num_ranks=2)
    mlx = RunSpec(**{**jax.to_dict(), "framework": "mlx"})
    ddp = RunSpec(**{**jax.to_dict(), "strategy": "ddp"})
    params = estimate_run_memory(ddp)["parameters"]
    assert estimate_run_memory(jax)["gathered_unit"] == 2 * params  # every unit's weights and the full gradient
    assert estimate_run_memory(mlx)["gathered_unit"] < 2 * params  # MLX gathers one unit at a time
    assert estimate_run_memory(jax)["activations"] == estimate_run_memory(ddp)["activations"]  # nothing recomputed
    assert estimate_run_memory(mlx)["activations"] < estimate_run_memory(ddp)["activations"]
    profile = profile_from_measurements(measured(), profile_key_fields(jax, 1), cost_s=1.0)
    assert estimate_with_profile(jax, profile)["activations"] == 21_000  # the profile's at 4 sequences, unscaled


def test_jaxs_update_beside_backward_is_added_where_a_rank_updates_the_whole_state(tmp_path):
    """The whole JAX step holds part of the update beside the backward's peak: an LM of 33.7M parameters (128.5
    MiB), 4 sequences of 256 at 2 ranks, had truth 1.15x its prediction under DDP without it. A rank that updates
    its shard does so after its reduce-scatters: that LM's fsdp-row read 1.07x without the term, and the built-in
    LM's (d=256) 1.05 without it and 0.88 with the rank's share of it, so a sharded update adds none."""
    from workbench.ranks.profile_jax import update_beside_backward
    from workbench.runs.spec import VALIDATION_MODEL

    ddp = RunSpec(framework="jax", strategy="ddp", model=VALIDATION_MODEL, global_batch=8, num_ranks=2)
    row = RunSpec(**{**ddp.to_dict(), "strategy": "fsdp-row"})
    alone = RunSpec(**{**row.to_dict(), "num_ranks": 1})  # one rank updates the whole state, whatever the strategy
    params = estimate_run_memory(ddp)["parameters"]
    beside = params // 2
    plain = profile_from_measurements(measured(), profile_key_fields(ddp, 1), cost_s=1.0)
    profiled = profile_from_measurements({**measured(), "parameter_bytes": params, "gradient_bytes": params,
                                          "optimizer_state_bytes": 2 * params, "update_beside_backward_bytes": beside}, profile_key_fields(ddp, 1), 1.0)
    for spec, share in ((ddp, 1), (row, 0), (alone, 1)):
        added = estimate_with_profile(spec, profiled)["activations"] - estimate_with_profile(spec, plain)["activations"]
        assert added == beside * share, spec
        assert ("update beside backward" in next(c.formula for c in estimate_with_profile(spec, profiled).components
                                                 if c.name == "activations")) == bool(share)
    assert load_profile(save_profile(tmp_path / "p.json", profiled)).update_beside_backward_bytes == beside
    # what the profile reads: the step's rise at the largest size beyond forward and backward alone, where the
    # backward set it; nothing where the update set the step's peak at both sizes; None where it was not read
    assert update_beside_backward(400, 800, 650) == 150
    assert update_beside_backward(400, 410, 300) == 0
    assert update_beside_backward(400, 800, 900) == 0
    assert update_beside_backward(None, 800, 650) is None and update_beside_backward(400, None, 650) is None
    assert update_beside_backward(400, 800, None) is None


def test_jaxs_ddp_all_reduces_in_place_and_mlxs_keeps_the_averaged_copy_and_the_bucket():
    """JAX's jitted DDP step psums each array and XLA writes the result over the dead gradient: on the validation
    LM at 2 ranks its plan was 84.8 MiB and the rank's VmHWM 86.7 MiB, 105.8 MiB predicted with MLX's buffers."""
    from workbench.estimate.memory import estimate_memory
    from workbench.runs.spec import VALIDATION_MODEL

    jax = RunSpec(framework="jax", strategy="ddp", model=VALIDATION_MODEL, global_batch=8, num_ranks=2)
    mlx = RunSpec(**{**jax.to_dict(), "framework": "mlx"})
    assert estimate_run_memory(jax)["reduced_gradients"] == estimate_run_memory(jax)["all_reduce_buffer"] == 0
    assert estimate_run_memory(mlx)["reduced_gradients"] == estimate_run_memory(mlx)["parameters"]
    assert estimate_run_memory(mlx)["all_reduce_buffer"] > 0
    with pytest.raises(ValueError, match="sync_in_place must be True or False"):
        estimate_memory(10**6, "ddp", 2, sync_in_place="yes")


def test_the_default_sizes_are_the_runs_micro_batch_its_half_and_quarter():
    assert default_micro_batch_sizes(8) == (2, 4, 8)
    assert default_micro_batch_sizes(2) == (1, 2)
    assert default_micro_batch_sizes(1) == (1, 2)
    with pytest.raises(ValueError, match="micro_batch_sizes=.*two or more distinct"):
        profile_model(RunSpec(model=LM), "/nonexistent-root", micro_batch_sizes=(4, 4))


def test_the_attention_example_is_one_model_in_both_frameworks():
    """examples/tiny_attention_lm (issue 26's model): same parameters and the same loss in MLX and JAX."""
    import jax.numpy as jnp
    import mlx.core as mx
    import numpy as np

    from examples import tiny_attention_lm as example
    from workbench.adapters.jax.base import spec_from_nnx
    from workbench.adapters.mlx.base import spec_from_mlx
    from workbench.ranks.user_model import nnx_flat_params

    (mlx_model, mlx_loss), (jax_model, jax_loss) = example.mlx_factory(seed=3), example.jax_factory(seed=3)
    shapes = {p: tuple(s) for p, s in example.param_shapes().items()}
    assert {p.path: p.shape for p in spec_from_mlx(mlx_model)} == {p.path: p.shape for p in spec_from_nnx(jax_model)} \
        == shapes and sum(int(np.prod(s)) for s in shapes.values()) == 309_120
    tokens = np.random.default_rng(0).integers(0, example.VOCAB_SIZE, (2, example.SEQ_LEN + 1))
    loss_m = mlx_loss(mlx_model, mx.array(tokens[:, :-1]), mx.array(tokens[:, 1:]))
    loss_j = jax_loss(nnx_flat_params(jax_model), (jnp.asarray(tokens[:, :-1]), jnp.asarray(tokens[:, 1:])))
    np.testing.assert_allclose(float(loss_m), float(loss_j), rtol=1e-5)


def test_a_profile_keeps_the_trainers_step_and_its_overhead_beyond_the_parts_it_also_times(tmp_path):
    fields = profile_key_fields(RunSpec(model=LM), 1, 2)
    # each step timed 4, 5 and 7 ms over the bare forward and backward and the update just before it: 5 ms
    times = dict(step_s_samples=[0.306, 0.508, 0.310], step_bare_s_samples=[0.3, 0.5, 0.3],
                 step_update_s_samples=[0.002, 0.003, 0.003])
    profile = profile_from_measurements(measured(**times, co_runners=2), fields, cost_s=2.0)
    assert profile.step_overhead_s == pytest.approx(0.005) and profile.co_runners == 2
    assert profile_from_measurements(measured(), fields, cost_s=2.0).step_overhead_s is None  # not timed
    faster = profile_from_measurements(measured(step_s_samples=[0.1, 0.3], step_bare_s_samples=[0.3, 0.3],
                                                step_update_s_samples=[0.0, 0.0]), fields, cost_s=2.0)
    assert faster.step_overhead_s == 0.0  # a step timed faster than its parts (noise) is no negative overhead
    path = save_profile(profile_path(tmp_path, fields), profile)
    assert load_profile(path) == profile and json.loads(path.read_text())["step_overhead_s"] == pytest.approx(0.005)
    for wrong in (dict(step_s_samples=[0.3]), dict(times, step_bare_s_samples=[0.3, 0.2]),
                  {name: [] for name in times}):
        with pytest.raises(ValueError, match="step_update_s_samples: as many seconds each"):
            profile_from_measurements(measured(**wrong), fields, cost_s=2.0)


def test_the_key_holds_the_records_version_and_the_processes_that_measured_at_once():
    """A profile stored by the code before the trainer's step was timed (version 1), or before JAX's whole step was
    measured (2), or before MLX's activations with each block recomputed were (4), or before JAX's plan on a mesh
    was (5), is never found under today's key: it is measured again, not read as if it held the overhead, the
    update beside backward, the recomputed blocks or the mesh plan (the old file is left where it was)."""
    fields = profile_key_fields(RunSpec(model=LM), 1)
    assert fields["profile_version"] == PROFILE_VERSION == 8 and fields["co_runners"] == 1
    old = {k: v for k, v in fields.items() if k not in ("profile_version", "co_runners")}
    assert profile_key(old) != profile_key(fields)
    assert profile_key(profile_key_fields(RunSpec(model=LM), 1, 2)) != profile_key(fields)


def test_what_processes_measured_at_once_is_one_measurement_with_every_processs_samples():
    one = measured(step_s_samples=[1.0, 2.0], step_bare_s_samples=[0.9, 1.9], step_update_s_samples=[0, 0],
                   update_s=0.002, peak_rss_bytes=5)
    two = measured(compute_s_samples=[[0.3], [0.6], [1.2]], step_s_samples=[1.1], step_bare_s_samples=[1.0],
                   step_update_s_samples=[0], update_s=0.004,
                   activation_samples=[[1], [2], [3]], peak_rss_bytes=9)
    merged = merge_co_runners([one, two])
    # every process's activation bytes too: the fit takes each size's largest, the higher peak any process met
    assert merged["co_runners"] == 2 and merged["activation_samples"] == [[11_000, 10_900, 1], [21_000, 20_000, 2],
                                                                          [41_000, 41_000, 3]]
    assert merged["compute_s_samples"] == [[0.2, 0.4, 0.3, 0.3], [0.5, 0.5, 0.6, 0.6], [1.0, 0.9, 1.1, 1.2]]
    assert merged["step_s_samples"] == [1.0, 2.0, 1.1] and merged["step_bare_s_samples"] == [0.9, 1.9, 1.0]
    assert merged.get("forward_s_samples") is None
    assert merged["update_s"] == 0.004 and merged["peak_rss_bytes"] == 9
    assert merge_co_runners([one]) == {**one, "co_runners": 1}


def test_profiling_processes_start_measuring_together_and_a_missing_peer_is_named(tmp_path):
    wait_for_peers(None, 0, 1)  # alone: nothing to wait for
    (tmp_path / "ready-1").write_text("ready")
    wait_for_peers(tmp_path, 0, 2, timeout_s=5)  # the other is ready
    assert (tmp_path / "ready-0").is_file()
    with pytest.raises(TimeoutError, match=r"peers \[2\] of 3 not at 'ready'"):
        wait_for_peers(tmp_path, 0, 3, timeout_s=0.05)
    # each phase of measurements starts together too: a peer still at the last phase is waited for, and named
    with pytest.raises(TimeoutError, match=r"peers \[1\] of 2 not at 'step'"):
        wait_for_peers(tmp_path, 0, 2, "step", timeout_s=0.05)
    (tmp_path / "step-1").write_text("step")
    wait_for_peers(tmp_path, 0, 2, "step", timeout_s=5)
    assert (tmp_path / "step-0").is_file()


def test_what_the_ranks_do_to_meet_before_a_measured_call_is_not_counted_in_its_rise():
    """rss_above's ``ready`` (a run's ranks meeting before the step whose peak is read) runs before the mark is
    reset: memory it touches and keeps is not the call's, and the call's own 32 MiB are (less pages already resident)."""
    if not high_water_mark_resets():
        pytest.skip("this kernel does not reset VmHWM (/proc/self/clear_refs)")
    import numpy as np

    kept = []
    above, _ = rss_above(lambda: None, ready=lambda: kept.append(np.ones(64 * 2**20 // 8)))
    assert kept and above < 16 * 2**20, above
    above, total = rss_above(lambda: float(np.ones(32 * 2**20 // 8).sum()), ready=kept.clear)
    assert total == 4 * 2**20 and 30 * 2**20 <= above < 48 * 2**20, above


def test_a_profiling_process_done_first_keeps_the_cores_busy_until_its_peers_are_done(tmp_path):
    busy_until_peers_done(None, 0, 1)  # alone: returns at once
    (tmp_path / "done-1").write_text("done")
    t0 = time.monotonic()
    busy_until_peers_done(tmp_path, 0, 2, timeout_s=30)  # the other is done: returns at once
    assert (tmp_path / "done-0").is_file() and time.monotonic() - t0 < 10
    t0 = time.monotonic()
    busy_until_peers_done(tmp_path, 0, 3, timeout_s=0.2)  # peer 2 never finishes: bounded by the timeout
    assert 0.2 <= time.monotonic() - t0 < 10


def test_a_profile_for_ranks_on_other_hosts_is_keyed_by_the_blas_they_run():
    """An MLX rank on another host runs MLX's own BLAS (the OpenBLAS shim is this machine's), so the advisor profiles
    with it there: the rig's ranks measured 709 ms a step where a profile on this machine's OpenBLAS predicted 221."""
    from workbench.adapters.mlx.blas import BLAS_ENV, expected_blas

    spec = RunSpec(model=LM)
    there = profile_key_fields(spec, 1, 1, {BLAS_ENV: "reference"})
    assert there["blas"] == expected_blas({BLAS_ENV: "reference"})
    here = profile_key_fields(spec, 1, 1, {BLAS_ENV: "openblas"})
    assert here["blas"] == expected_blas({BLAS_ENV: "openblas"})
    assert (profile_key(there) == profile_key(here)) == (there["blas"] == here["blas"])


def test_a_jax_run_of_two_or_more_ranks_takes_the_truth_scaled_to_xlas_plan_on_a_mesh(tmp_path):
    """XLA plans a rank's step on a mesh of two devices below the one-device program the profile runs (a
    Qwen3-shaped LM at 8 sequences: 20.3 MiB against 24.3-24.6); the truth, size by size, is scaled by the two
    plans' ratio for a run of two or more ranks, and taken as measured for one rank."""
    from workbench.runs.spec import VALIDATION_MODEL

    two = RunSpec(framework="jax", strategy="fsdp-row", model=VALIDATION_MODEL, global_batch=16, num_ranks=2)
    one = RunSpec(**{**two.to_dict(), "num_ranks": 1, "global_batch": 8})
    plans = {"plan_activation_bytes": [10_000, 20_000, 50_000], "mesh_plan_activation_bytes": [10_000, 20_000, 40_000]}
    profile = profile_from_measurements(measured(**plans), profile_key_fields(two, 1), cost_s=1.0)
    truth = [max(s) for s in profile.activation_samples]  # 11,000, 21,000, 41,000
    assert profile.mesh_activation_fit == fit_linear([2, 4, 8], [truth[0], truth[1], truth[2] * 0.8], what="x")
    assert profile.activation_bytes_at(8, 2) < profile.activation_bytes_at(8) == round(profile.activation_fit.at(8))
    at_two = estimate_with_profile(two, profile)
    assert at_two["activations"] == profile.activation_bytes_at(8, 2)
    assert "XLA's plan on a mesh of two" in next(c.formula for c in at_two.components if c.name == "activations")
    assert estimate_with_profile(one, profile)["activations"] == profile.activation_bytes_at(8)
    assert load_profile(save_profile(tmp_path / "p.json", profile)).mesh_plan_activation_bytes == (10_000, 20_000, 40_000)
    for missing in (None, [10_000, 0, 40_000]):  # not compiled (one device), or a plan of nothing: the truth as read
        unscaled = profile_from_measurements(measured(**{**plans, "mesh_plan_activation_bytes": missing}),
                                             profile_key_fields(two, 1), cost_s=1.0)
        assert unscaled.mesh_activation_fit is None and unscaled.activation_bytes_at(8, 2) == unscaled.activation_bytes_at(8)

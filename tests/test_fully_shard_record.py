"""MLX's own ``fully_shard`` as a registered strategy (issue 28), in one process: the record's implementation,
what RunSpec accepts and refuses for it, and the run's memory estimate. Its real runs: test_fully_shard_runs."""

import importlib

import pytest

from workbench.core.fully_shard_plan import plan_fully_shard
from workbench.core.specs import ModelSpec
from workbench.runs.estimate import estimate_run_activation_bytes, estimate_run_memory, run_model_spec
from workbench.runs.spec import RunSpec
from workbench.strategies import StepShape, get_strategy, strategies

TINY = dict(vocab_size=32, seq_len=16, dim=32, num_layers=2, num_heads=2, mlp_dim=64)


def spec(**kw):
    return RunSpec(**{"strategy": "mlx-fully-shard", "num_ranks": 2, "steps": 2, "global_batch": 8, "model": TINY,
                      **kw})


def test_the_record_runs_in_mlx_through_the_fully_shard_trainer():
    from workbench.adapters.mlx.fully_shard_trainer import FullyShardTrainer

    record = get_strategy("mlx-fully-shard", framework="mlx")
    assert record in strategies("mlx") and record.frameworks == ("mlx",)
    impl = record.implementation("mlx")
    module, _, name = impl.builder.partition(":")
    assert getattr(importlib.import_module(module), name) is FullyShardTrainer  # what the ranks build
    assert impl.sync_per == "unit"
    # The trainer all-sums the squared norm of its shards when max_norm is set (clip_grad_norm_sharded), and a
    # run always sets it (train_mlx passes max_norm=inf to record the norm): a run's step always issues it.
    assert impl.norm == "always" and impl.reduces_norm(False) and not impl.defers_sync


def test_run_spec_accepts_it_on_mlx_and_refuses_it_on_jax_naming_what_jax_runs():
    assert spec().strategy == "mlx-fully-shard"
    assert spec(num_microbatches=2, defer_sync=False).defer_sync is False
    jax_runs = ", ".join(s.name for s in strategies("jax"))
    with pytest.raises(ValueError, match=r"RunSpec.strategy='mlx-fully-shard': strategy 'mlx-fully-shard' has no "
                                         rf"'jax' implementation \(it runs in: mlx\); jax runs: {jax_runs}\."):
        spec(framework="jax")


def test_run_spec_refuses_a_deferred_sync_it_cannot_do_naming_the_field():
    """FullyShardTrainer reduce-scatters every unit in every micro-batch's backward (fully_shard's VJP) and
    refuses defer_sync; the spec says so before any engine starts. One micro-batch syncs once either way."""
    with pytest.raises(ValueError, match=r"RunSpec.defer_sync=True: strategy 'mlx-fully-shard' syncs in every "
                                         r"micro-batch's backward \(MLX's fully_shard reduce-scatters every unit .* "
                                         r"cannot defer the sync to the last of num_microbatches=2; pass defer_sync=False"):
        spec(num_microbatches=2)
    assert spec(num_microbatches=1, defer_sync=True).defer_sync is True
    assert RunSpec(strategy="fsdp-full", num_microbatches=2, global_batch=8, model=TINY).defer_sync  # ZeRO-3 can


def test_run_spec_refuses_what_fully_shard_would_refuse_naming_the_parameters():
    """fully_shard cuts axis 0 (MLX's rule), not the flattened rows: an MLP width of 6 over 4 ranks tiles as rows
    (fsdp-row takes it) but not along axis 0; RunSpec names the parameters in MLX's words."""
    narrow = {**TINY, "mlp_dim": 6}
    assert RunSpec(strategy="fsdp-row", num_ranks=4, global_batch=8, model=narrow).strategy == "fsdp-row"
    with pytest.raises(ValueError, match=r"RunSpec.strategy='mlx-fully-shard': fully_shard over num_ranks=4 would "
                                         r"refuse 2 parameter\(s\) of the model: Cannot shard parameter "
                                         r"'layers.0.mlp.w_in.weight' with shape \(6, 32\) across 4 devices: axis 0 "
                                         r"must be divisible by 4. Cannot shard parameter 'layers.1.mlp.w_in.weight'"):
        spec(num_ranks=4, model=narrow)
    with pytest.raises(ValueError, match=r"would refuse 20 parameter\(s\).* And 16 more \(workbench.core."
                                         r"fully_shard_plan.check_fully_shard lists all\)\."):
        spec(num_ranks=3, global_batch=9)


def test_the_run_estimate_keeps_every_wrapped_unit_gathered_to_backward():
    """Units are the modules the trainer wraps (core.fully_shard_plan: each block, then the root): all their
    weights from forward to backward, plus the largest unit's full gradient and, at 2 ranks, the supplied ring
    reduce-scatter's exchange of it (both rows and their sum, 1.5 x); activations of the whole model (nothing
    recomputed). A run gathers in its precision: no compute_dtype copies."""
    for precision, nbytes in (("float32", 4), ("bfloat16", 2)):
        s = spec(precision=precision)
        est = estimate_run_memory(s)
        model = run_model_spec(s)
        plan = plan_fully_shard(model, 2)
        assert plan.wrap_order == ["layers.0", "layers.1", "root"]
        largest = max(u.num_params for u in plan.units)
        assert est["gathered_unit"] == model.num_params * nbytes + largest * nbytes + largest * nbytes * 3 // 2
        assert est["parameters"] == est["gradients"] == model.num_params * nbytes // 2
        assert est["activations"] == estimate_run_activation_bytes(s.config, 4, precision, recompute=False)
        assert est["activations"] > estimate_run_memory(spec(strategy="fsdp-full", precision=precision))["activations"]
        assert est.peak_phase == "backward"


def test_the_run_estimate_takes_the_units_the_trainer_wraps_in_a_user_model():
    """Two stacks with the same block indices: fully_shard wraps enc.layers.0 and dec.layers.0 apart (the
    trainer's plan), not as one 'block 0' of both."""
    shapes = ModelSpec.from_shapes({"embed.weight": (32, 8), "enc.layers.0.w": (64, 8), "dec.layers.0.w": (64, 8),
                                    "head.weight": (32, 8)})
    fields = {**spec().to_dict(), "model_factory": "examples.tiny_mlp_lm:mlx_factory",
              "model": {"vocab_size": 32, "seq_len": 16}}
    est = estimate_run_memory(fields, shapes)
    largest = 64 * 8 * 4  # a stack's block (512 parameters): the largest unit; 2 ranks: its exchange, 1.5 x
    assert est["gathered_unit"] == shapes.num_params * 4 + largest + largest * 3 // 2
    assert plan_fully_shard(shapes, 2).wrap_order == ["enc.layers.0", "dec.layers.0", "root"]


def test_the_records_collectives_for_micro_batches_that_each_sync():
    """fully_shard over G micro-batches (FullyShardTrainer): every unit gathered once per micro-batch and kept to
    backward (not gathered again), and reduce-scattered once per micro-batch; the norm's all-sum once."""
    record = get_strategy("mlx-fully-shard")
    units = (100.0, 100.0, 60.0)
    shape = StepShape(num_ranks=4, sync_bytes=units, num_microbatches=3, defer_sync=False, reduces_norm=True)
    assert record.collective_counts(shape) == {**record.collective_counts(StepShape(num_ranks=4, sync_bytes=())),
                                               "all_gather": 9, "reduce_scatter": 9, "all_reduce": 1}
    rows = {c.kind: c.data_bytes for c in record.step_collectives(shape)}
    assert rows["all_gather"] == rows["reduce_scatter"] == 3 * 260.0

"""Memory estimates: ZeRO paper figure, orderings, transient terms, the Qwen 3.7B gap, estimator disagreements."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench import ModelSpec, ParamSpec, plan_buckets, plan_shards
from workbench.core.presets import PRESETS, get_preset
from workbench.estimate.activations import estimate_activation_bytes, largest_unit_params
from workbench.estimate.breakdown import COMPONENTS, PHASES
from workbench.estimate.cases import compare_estimators, explain_qwen_3_7b
from workbench.estimate.knobs import STRATEGIES, UPDATE_COPIES
from workbench.estimate.memory import compare_strategies, estimate_memory

ZERO_PAPER = dict(param_dtype="float16", master_dtype="float32", optimizer="adam")


def tiny_spec(dtype="float32"):
    return ModelSpec.from_shapes({"embed.weight": (97, 8), "layers.0.w": (8, 8), "layers.0.b": (8,),
                                  "layers.1.w": (8, 8), "layers.1.b": (8,), "head.weight": (97, 8)}, dtype=dtype)


def test_zero_paper_figure_1():
    # Rajbhandari et al., arXiv:1910.02054, Figure 1: Psi = 7.5B, N_d = 64, K = 12.
    expected = {"ddp": 120.0, "zero1": 31.4, "zero2": 16.6, "zero3": 1.9}
    for strategy, gb in expected.items():
        est = estimate_memory(7_500_000_000, strategy, 64, **ZERO_PAPER)
        assert round(est.total_bytes / 1e9, 1) == gb
        assert est["master_weights"] + est["optimizer_state"] == 12 * 7_500_000_000 // (1 if strategy == "ddp" else 64)


@settings(max_examples=60, deadline=None)
@given(strategy=st.sampled_from(STRATEGIES), n=st.integers(1, 64), optimizer=st.sampled_from(["sgd", "sgd_momentum", "adam"]),
       accum=st.sampled_from([None, "float32"]), cap=st.integers(0, 4096), act=st.integers(0, 10**9),
       copies=st.sampled_from(UPDATE_COPIES))
def test_total_is_states_plus_the_larger_transient_phase(strategy, n, optimizer, accum, cap, act, copies):
    spec = tiny_spec()
    plan = plan_buckets(spec, cap)
    est = estimate_memory(spec, strategy, n, optimizer=optimizer, grad_accum_dtype=accum, bucket_plan=plan,
                          shard_plan=plan_shards(plan, n, "flat"), activation_bytes=act, update_copies=copies)
    assert [c.name for c in est.components] == list(COMPONENTS)
    by_phase = {p: sum(c.rank_bytes for c in est.components if c.phase == p) for p in PHASES}
    assert sum(by_phase.values()) == sum(est.as_dict().values())  # every row in exactly one phase
    assert est.total_bytes == by_phase["states"] + max(by_phase["step"], by_phase["backward"])
    assert est.total_bytes - by_phase["states"] == est.phase_bytes(est.peak_phase)
    assert all(c.rank_bytes >= 0 for c in est.components)
    assert est["activations"] == act


@pytest.mark.parametrize("n", [2, 8, 64])
def test_zero_stages_order_for_n_above_one(n):
    est = compare_strategies(3_000_000_000, n, **ZERO_PAPER)
    assert est["zero3"].total_bytes < est["zero2"].total_bytes < est["zero1"].total_bytes < est["ddp"].total_bytes
    assert est["fsdp"].model_state_bytes == est["zero1"].model_state_bytes


def test_all_strategies_equal_at_one_rank_except_transients():
    spec = get_preset("tiny-llama", "bfloat16")
    est = compare_strategies(spec, 1, strategies=STRATEGIES, bucket_plan=plan_buckets(spec, 4096))
    assert len({e.model_state_bytes for e in est.values()}) == 1
    assert est["zero3"]["gathered_unit"] > 0 and est["ddp"]["gathered_unit"] == 0


def test_bucket_buffers_grow_with_communication_size():
    spec = get_preset("tiny-llama", "float32")
    for strategy, row in [("fsdp", "reduce_scatter_buffer"), ("fsdp", "all_gather_buffer"), ("zero2", "reduce_scatter_buffer"),
                          ("ddp", "all_reduce_buffer")]:
        sizes = [estimate_memory(spec, strategy, 4, bucket_plan=plan_buckets(spec, cap))[row] for cap in (0, 2**14, 2**16, 2**20)]
        assert sizes == sorted(sizes) and sizes[0] < sizes[-1], (strategy, row, sizes)
    # largest bucket B of fp32 gradients: B + B/N for the reduce-scatter
    plan = plan_buckets(spec, 2**16)
    big = int(plan.bucket_elems.max()) * 4
    assert estimate_memory(spec, "fsdp", 4, bucket_plan=plan)["reduce_scatter_buffer"] == big + big // 4
    assert estimate_memory(spec, "ddp", 4, bucket_plan=plan)["all_reduce_buffer"] == big  # the all-reduced copy is reduced_gradients


def test_flat_padding_taken_from_plan():
    spec = tiny_spec()  # 1816 fp32 elements in one bucket: 3 ranks pad 2 elements on the last
    plan = plan_shards(plan_buckets(spec, 2**20), 3, "flat")
    pad = int(plan.rank_padding_bytes.max())
    assert pad > 0
    est = estimate_memory(spec, "zero3", 3, optimizer="sgd", shard_plan=plan)
    assert est["flat_padding"] == pad // 4 * (4 + 4)  # fp32 parameters and gradients sharded
    est = estimate_memory(spec, "zero2", 3, optimizer="adam", shard_plan=plan)
    assert est["flat_padding"] == pad // 4 * (4 + 8)  # gradients + m + v; no master copy for fp32 parameters
    assert estimate_memory(spec, "ddp", 3, shard_plan=plan)["flat_padding"] == 0


def test_zero3_gathered_unit():
    spec = get_preset("qwen3-4b")
    assert largest_unit_params(spec) == 151936 * 2560 + 2560  # root unit: tied embedding and final norm
    resharded = estimate_memory(spec, "zero3", 8, units={"a": 100, "b": 300})
    assert resharded["gathered_unit"] == 300 * (2 + 2)
    kept = estimate_memory(spec, "zero3", 8, units={"a": 100, "b": 300}, reshard_after_forward=False)
    assert kept["gathered_unit"] == spec.num_params * 2 + 300 * 2
    assert kept.total_bytes > resharded.total_bytes
    # MLX's ShardedUnit: gathered bucket + rebuild_arrays copies (2 x 300 x 2 B), full gradient (300 x 2 B),
    # reduce-scatter buffers: the 300 rows exchanged + this rank's row and their sum (2 x 300 x 2 B / 8)
    mlx = estimate_memory(spec, "zero3", 8, units={"a": 100, "b": 300}, unit_buffers="mlx")
    assert mlx["gathered_unit"] == 2 * 300 * 2 + 300 * 2 + 300 * 2 + 2 * (300 * 2 // 8)
    assert kept["gathered_unit"] == estimate_memory(spec, "zero3", 8, units={"a": 100, "b": 300},
                                                    reshard_after_forward=False, unit_buffers="mlx")["gathered_unit"]
    with pytest.raises(ValueError, match="unit_buffers"):
        estimate_memory(spec, "zero3", 8, unit_buffers="torch")


def test_hsdp_shape_and_memory():
    hsdp = estimate_memory(10**9, "hsdp", 8, num_replicas=4, world_size=32)
    assert hsdp.model_state_bytes == estimate_memory(10**9, "zero3", 8).model_state_bytes
    with pytest.raises(ValueError, match="world_size"):
        estimate_memory(10**9, "hsdp", 8, num_replicas=3, world_size=32)
    with pytest.raises(ValueError, match="num_replicas"):
        estimate_memory(10**9, "zero2", 8, num_replicas=2)


@pytest.mark.parametrize("kwargs, knob", [
    (dict(model=-1), "model"), (dict(num_shards=0), "num_shards"), (dict(strategy="zero4"), "strategy"),
    (dict(optimizer="lion"), "optimizer"), (dict(activation_bytes=-5), "activation_bytes"),
    (dict(param_dtype="float7"), "param_dtype"), (dict(update_copies="some"), "update_copies"), (dict(units={"x": -1}, strategy="zero3"), "units"),
])
def test_bad_input_names_the_knob(kwargs, knob):
    args = dict(model=10**6, strategy="fsdp", num_shards=4) | kwargs
    with pytest.raises(ValueError, match=knob):
        estimate_memory(args.pop("model"), args.pop("strategy"), args.pop("num_shards"), **args)


def test_shard_plan_for_other_num_shards_is_rejected():
    spec = tiny_spec()
    with pytest.raises(ValueError, match="shard_plan"):
        estimate_memory(spec, "zero2", 4, shard_plan=plan_shards(plan_buckets(spec), 2, "flat"))


def test_activations_korthikanti():
    # s*b*h*(34 + 5*a*s/h) per layer: s=2048, b=1, h=4096, a=32, L=32
    one = 2048 * 4096 * (34 + 5 * 32 * 2048 / 4096)
    assert estimate_activation_bytes(seq_len=2048, micro_batch_size=1, hidden_size=4096, num_heads=32, num_layers=32) == 32 * one
    assert estimate_activation_bytes(seq_len=2048, micro_batch_size=1, config="llama-3-8b") == 32 * one
    assert estimate_activation_bytes(seq_len=2048, micro_batch_size=1, config=PRESETS["llama-3-8b"], num_layers=1) == one
    with pytest.raises(ValueError, match="num_heads"):
        estimate_activation_bytes(seq_len=16, micro_batch_size=1, hidden_size=64, num_layers=2)
    with pytest.raises(ValueError, match="seq_len"):
        estimate_activation_bytes(seq_len=-1, micro_batch_size=1, config="gpt2")



def test_activation_levers_fused_attention_and_full_recompute():
    """Issue 29 item 5: the levers notebook 03 names. s=2048, b=2, h=4096, a=32, L=32 (llama-3-8b's shape)."""
    s, b, h, a, n_layers = 2048, 2, 4096, 32, 32
    inputs, scores = 34 * s * b * h, 5 * a * s * s * b  # per layer: 570,425,344 and 1,342,177,280 bytes
    shape = dict(seq_len=s, micro_batch_size=b, hidden_size=h, num_heads=a, num_layers=n_layers)
    assert estimate_activation_bytes(**shape) == n_layers * (inputs + scores) == 61_203_283_968
    # a fused attention kernel keeps no s x s scores: 34 sbh per layer
    assert estimate_activation_bytes(**shape, fused_attention=True) == n_layers * inputs == 18_253_611_008
    # full recompute: each layer's 16-bit input (2 sbh), plus the one layer the backward recomputes
    assert estimate_activation_bytes(**shape, recompute=True) == n_layers * 2 * s * b * h + inputs + scores == 2_986_344_448
    both = estimate_activation_bytes(**shape, recompute=True, fused_attention=True)
    assert both == n_layers * 2 * s * b * h + inputs == 1_644_167_168
    assert estimate_activation_bytes(seq_len=s, micro_batch_size=b, config="llama-3-8b", recompute=True) == 2_986_344_448
    with pytest.raises(ValueError, match="recompute"):
        estimate_activation_bytes(**shape, recompute="full")
    from workbench.estimate.grid import estimate_breakdowns

    (plain,), (levered,) = (estimate_breakdowns("llama-3-8b", ("fsdp",), (8,), micro_batch_size=b, seq_len=s, **k)
                            for k in (dict(), dict(recompute=True, fused_attention=True)))
    assert (plain["activations"], levered["activations"]) == (61_203_283_968, 1_644_167_168)
    assert plain.phase_bytes("states") == levered.phase_bytes("states")  # only the activations change

def test_qwen_3_7b_gap_is_the_sharded_optimizer_state():
    gap = explain_qwen_3_7b()
    assert gap.measured_difference_bytes == pytest.approx(27.7337e9)
    assert gap.predicted_difference_bytes == pytest.approx(7 / 8 * 2 * 4 * 3.7e9)
    assert abs(gap.predicted_difference_bytes - 27.7e9) / 27.7e9 < 0.10
    assert {k for k, v in gap.component_difference_bytes.items() if v} == {"optimizer_state"}
    assert gap.residual_bytes == gap.measured_difference_bytes - gap.predicted_difference_bytes
    assert gap.unmodelled_baseline_bytes > 0 and any("activations" in u for u in gap.unknowns)


def test_compare_estimators_reference_case():
    c = compare_estimators(7_000_000_000, 8)
    assert (c.theory_bytes, c.deepspeed_code_bytes, c.deepspeed_docs_bytes) == (26_250_000_000, 29_750_000_000, 42_000_000_000)
    assert c.workbench_bytes == c.deepspeed_code_bytes
    assert set(c.reasons) == {"theory_bytes", "deepspeed_code_bytes", "deepspeed_docs_bytes", "workbench_bytes"}
    c3 = compare_estimators(7_000_000_000, 8, stage=3, largest_layer_params=10**8)
    assert c3.deepspeed_code_bytes == 4 * 10**8 + 18 * 7_000_000_000 // 8 == c3.deepspeed_docs_bytes
    assert c3.theory_bytes == 14_000_000_000
    with pytest.raises(ValueError, match="stage"):
        compare_estimators(10**9, 8, stage=1)
    with pytest.raises(ValueError, match="num_shards"):
        compare_estimators(10**9, 0)


def test_param_dtype_defaults_to_spec():
    assert estimate_memory(tiny_spec("float32"), "ddp", 1, optimizer="sgd").total_bytes == 2 * tiny_spec().nbytes
    mixed = ModelSpec("m", (ParamSpec("a", (4,), "float32"), ParamSpec("b", (4,), "bfloat16")))
    with pytest.raises(ValueError, match="param_dtype"):
        estimate_memory(mixed, "ddp", 1)


def test_non_finite_counts_name_the_knob():
    from workbench.estimate.memory import estimate_memory

    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="num_shards"):
            estimate_memory(7_000_000_000, "zero2", num_shards=bad)


def test_update_copies_rows():
    # The MLX step (measured in tests/test_validation.py on real runs): DDP's averaged gradients and
    # the new parameter tree sit beside the old; FSDP holds only the new tree; ZeRO-3 its new shard.
    psi, n = 10**6, 4
    knobs = dict(param_dtype="float32", master_dtype=None, optimizer="adamw")
    ddp = estimate_memory(psi, "ddp", n, update_copies="parameters", **knobs)
    assert (ddp["reduced_gradients"], ddp["updated_parameters"], ddp["updated_optimizer_state"]) == (4 * psi, 4 * psi, 0)
    fsdp = estimate_memory(psi, "fsdp", n, update_copies="parameters", **knobs)
    assert (fsdp["reduced_gradients"], fsdp["updated_parameters"]) == (0, 4 * psi)
    assert estimate_memory(psi, "zero3", n, update_copies="parameters", **knobs)["updated_parameters"] == psi
    jax_like = estimate_memory(psi, "fsdp", n, update_copies="parameters_and_state", **knobs)
    assert jax_like["updated_optimizer_state"] == fsdp["optimizer_state"] == 8 * psi // n
    theory = estimate_memory(psi, "ddp", n, **knobs)
    assert theory.total_bytes == theory.model_state_bytes  # "none": the ZeRO paper's model states only
    assert ddp.total_bytes == theory.total_bytes + 8 * psi and ddp.peak_phase == "step"


def test_resident_fsdp_keeps_a_master_shard_with_its_padding():
    """MLX's resident FSDP (issue 30): the new parameter tree of "parameters", and each bucket's master shard for
    the run, in the parameters' dtype (master_weights, sharded, at rest): in both phases, and padded where flat."""
    spec, n = tiny_spec("float32"), 4
    plan = plan_buckets(spec, 512)
    knobs = dict(param_dtype="float32", master_dtype=None, optimizer="adamw", bucket_plan=plan,
                 shard_plan=plan_shards(plan, n, "flat"), activation_bytes=10**6)
    plain = estimate_memory(spec, "fsdp-flat", n, update_copies="parameters", **knobs)
    resident = estimate_memory(spec, "fsdp-flat", n, update_copies="parameters_and_master_shard", **knobs)
    pad_elems = -(-int(plan_shards(plan, n, "flat").rank_padding_bytes.max()) // 4)
    assert plain["master_weights"] == 0 and resident["master_weights"] == -(-4 * spec.num_params // n)
    assert resident["flat_padding"] - plain["flat_padding"] == 4 * pad_elems  # the shard's padding too
    assert resident.phase_bytes("step") == plain.phase_bytes("step") and resident.peak_phase == "backward"
    assert resident.total_bytes - plain.total_bytes == resident["master_weights"] + 4 * pad_elems
    # a master copy already given (fp32 beside bf16 parameters) is that shard: nothing more
    mixed = dict(knobs, param_dtype="bfloat16", master_dtype="float32")
    assert estimate_memory(spec, "fsdp-flat", n, update_copies="parameters_and_master_shard", **mixed).as_dict() == \
        estimate_memory(spec, "fsdp-flat", n, update_copies="parameters", **mixed).as_dict()


def test_a_runs_update_copies_are_its_implementations():
    """Each framework's step says what it writes beside the arrays it updates (the strategy records), and the
    run's estimate reads it: JAX's donated FSDP step nothing, MLX's resident FSDP the master shard."""
    from workbench.runs.estimate import estimate_run_memory
    from workbench.runs.spec import VALIDATION_MODEL, RunSpec
    from workbench.strategies import Implementation, get_strategy, strategies

    want = {("mlx", "ddp"): "parameters", ("mlx", "fsdp-row"): "parameters_and_master_shard",
            ("mlx", "fsdp-flat"): "parameters_and_master_shard", ("mlx", "fsdp-full"): "parameters",
            ("mlx", "mlx-fully-shard"): "parameters", ("jax", "ddp"): "parameters_and_state",
            ("jax", "fsdp-row"): "none", ("jax", "fsdp-flat"): "none", ("jax", "fsdp-full"): "parameters_and_state",
            ("jax", "hsdp-row"): "none"}
    assert {(i.framework, s.name): i.update_copies for s in strategies() for i in s.implementations} == want
    assert get_strategy("zero2").update_copies("jax") == "parameters_and_state"  # modelled only: its DDP step's
    assert get_strategy("zero2").implementation_in("jax") is None and get_strategy("fsdp-row").implementation_in(
        "jax") is get_strategy("fsdp-row").implementation("jax")
    assert get_strategy("fsdp-row").update_copies("mlx") == "parameters_and_master_shard"
    with pytest.raises(ValueError, match="update_copies='some'"):
        Implementation(framework="mlx", builder="m:f", update_copies="some")

    def run(framework, strategy):
        return estimate_run_memory(RunSpec(framework=framework, strategy=strategy, num_ranks=2, global_batch=8,
                                           model=VALIDATION_MODEL, communication_size=2**20))
    p = run("mlx", "ddp")["parameters"]
    mlx, jax = run("mlx", "fsdp-row"), run("jax", "fsdp-row")
    assert (mlx["master_weights"], mlx["updated_parameters"], mlx["updated_optimizer_state"]) == (p // 2, p, 0)
    assert (jax["master_weights"], jax["updated_parameters"], jax["updated_optimizer_state"]) == (0, 0, 0)
    assert run("jax", "ddp")["updated_optimizer_state"] == 2 * p  # not donated: new AdamW state beside the old
    assert get_strategy("fsdp-row").implementation("jax").update_copies == "none"


def test_backward_and_step_transients_do_not_add():
    est = estimate_memory(10**6, "fsdp", 2, param_dtype="float32", master_dtype=None, update_copies="parameters",
                          activation_bytes=10**9)
    assert est.peak_phase == "backward"
    assert est.total_bytes == est.phase_bytes("states") + 10**9 < sum(est.as_dict().values())


# ----------------------------------------------------------------------------- gradient accumulation
# The rows follow the MLX trainers (workbench.adapters.mlx.accum); their peaks are measured against
# these rows on real ranks in tests/test_mlx_zero3.py.


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("defer", [True, False])
def test_one_microbatch_is_the_model_without_accumulation(strategy, defer):
    spec = tiny_spec()
    plan = plan_buckets(spec, 512)
    for knobs in (dict(), dict(bucket_plan=plan, shard_plan=plan_shards(plan, 4, "flat"), activation_bytes=999,
                                update_copies="parameters", reshard_after_forward=False)):
        knobs |= dict(num_replicas=2) if strategy == "hsdp" else {}
        before = estimate_memory(spec, strategy, 4, **knobs)
        after = estimate_memory(spec, strategy, 4, num_microbatches=1, defer_sync=defer, **knobs)
        assert after == before and after["gradient_accumulator"] == 0


def test_accumulator_rows_by_strategy_and_mode():
    spec, n, g = tiny_spec("float32"), 4, 4
    psi, b = spec.num_params, 4  # fp32 gradients: 4 B each
    knobs = dict(optimizer="sgd", num_microbatches=g)
    units = {"block": 72, "root": 1552}
    for strategy in ("ddp", "fsdp", "zero1", "zero2", "zero3", "hsdp"):
        deferred = estimate_memory(spec, strategy, n, defer_sync=True, units=units, **knobs)
        every = estimate_memory(spec, strategy, n, defer_sync=False, units=units, **knobs)
        one = estimate_memory(spec, strategy, n, units=units, optimizer="sgd")
        assert deferred["gradient_accumulator"] == b * psi  # unsharded
        assert every["gradient_accumulator"] == (b * psi if strategy == "ddp" else -(-b * psi // n))
        for est in (deferred, every):  # held through the micro-batch loop, beside the micro-batch's gradient
            assert est.phase_bytes("states") == one.phase_bytes("states")
            assert est.phase_bytes("step") == one.phase_bytes("step")
        assert every["gathered_unit"] == one["gathered_unit"]
        if strategy in ("zero3", "hsdp"):  # every unit gathered, the gathered model's full gradient
            assert deferred["gathered_unit"] == 4 * psi + 4 * psi - -(-4 * psi // n)
            assert one["gathered_unit"] == 1552 * (4 + 4)
        else:
            assert deferred["gathered_unit"] == every["gathered_unit"] == 0
    # G beyond 1 does not change the bytes: one accumulator whatever the number of micro-batches
    assert (estimate_memory(spec, "fsdp", n, num_microbatches=2).as_dict()
            == estimate_memory(spec, "fsdp", n, num_microbatches=64).as_dict())


def test_accumulator_is_in_the_gradient_dtype():
    est = estimate_memory(10**6, "fsdp", 8, param_dtype="bfloat16", grad_dtype="float32", num_microbatches=2,
                          defer_sync=False)
    assert est["gradient_accumulator"] == 4 * 10**6 // 8
    accumulator = next(c for c in est.components if c.name == "gradient_accumulator")
    assert "4 B x 1,000,000" in accumulator.formula


def test_deferred_sync_costs_the_unsharded_accumulator_and_for_zero3_the_gathered_model():
    spec, n = get_preset("tiny-llama", "bfloat16"), 8
    psi, largest = spec.num_params, largest_unit_params(spec)
    knobs = dict(num_microbatches=4, activation_bytes=10**6)  # the loop sets the peak
    gap = {}
    for strategy in ("ddp", "fsdp", "zero3"):
        deferred, every = (estimate_memory(spec, strategy, n, defer_sync=d, **knobs) for d in (True, False))
        assert deferred.peak_phase == every.peak_phase == "backward"
        gap[strategy] = deferred.total_bytes - every.total_bytes
    shard = -(-2 * psi // n)
    assert gap["ddp"] == 0  # DDP's accumulator is full in both modes
    assert gap["fsdp"] == 2 * psi - shard  # (1 - 1/N) Psi x 2 B
    # ZeRO-3 also keeps every unit's parameters and the full micro-batch gradient, not one unit's
    assert gap["zero3"] == (2 * psi - shard) + (2 * psi + 2 * psi - shard) - largest * (2 + 2)


@pytest.mark.parametrize("kwargs, knob", [
    (dict(num_microbatches=0), "num_microbatches"), (dict(num_microbatches=1.5), "num_microbatches"),
    (dict(num_microbatches=True), "num_microbatches"), (dict(defer_sync="yes"), "defer_sync"),
    (dict(defer_sync=1), "defer_sync"),
])
def test_bad_accumulation_knobs_are_named(kwargs, knob):
    with pytest.raises(ValueError, match=knob):
        estimate_memory(10**6, "fsdp", 4, **kwargs)


def test_knobs_that_would_mislead_are_refused_naming_them():
    """Issue 14, item 13: fractional experts, a string for a flag, another model's plan, NumPy counts."""
    import numpy as np

    from workbench import plan_buckets
    from workbench.core.presets import get_preset
    from workbench.estimate.comm import estimate_comm

    moe = get_preset("mixtral-8x7b")
    with pytest.raises(ValueError, match="expert_parallel=3 must divide the 8 experts"):
        estimate_memory(moe, "zero3", 8, expert_parallel=3)
    assert estimate_memory(moe, "zero3", 8, expert_parallel=4).total_bytes > 0
    with pytest.raises(ValueError, match="reshard_after_forward must be True or False, got 'no'"):
        estimate_memory(10**9, "zero3", 8, reshard_after_forward="no")
    gpt2, llama = get_preset("gpt2"), get_preset("llama-3-8b")
    with pytest.raises(ValueError, match="reshard_after_forward must be True or False"):
        estimate_comm(plan_buckets(gpt2, 2**25), "zero3", 8, reshard_after_forward="no")
    with pytest.raises(ValueError, match="bucket_plan is of model 'gpt2'"):
        estimate_memory(llama, "ddp", 8, bucket_plan=plan_buckets(gpt2, 2**25))
    same = estimate_memory(10**9, "zero3", np.int64(8), activation_bytes=np.int64(1024))
    assert same.as_dict() == estimate_memory(10**9, "zero3", 8, activation_bytes=1024).as_dict()
    with pytest.raises(ValueError, match="num_shards must be an integer >= 1, got 2.5"):
        estimate_memory(10**9, "zero3", 2.5)


def test_collective_scratch_is_counted_under_zero3_only_and_refused_by_name():
    """XLA's CPU reduce-scatter over gloo copies its input and gloo's halving-doubling receives into half as much
    again: 1.5 x the largest reduce-scatter's input, held in backward beside the gathered model."""
    from workbench.runs.estimate import estimate_run_memory
    from workbench.runs.spec import VALIDATION_MODEL

    def run(framework, strategy):
        return estimate_run_memory(dict(framework=framework, strategy=strategy, num_ranks=2, precision="float32",
                                        optimizer="adamw", global_batch=8, communication_size=2**20,
                                        model=VALIDATION_MODEL))

    jax_full = run("jax", "fsdp-full")
    gradient = jax_full["gradients"] * 2  # the whole model's: ZeRO-3 keeps 1/2 at rest on 2 ranks
    assert jax_full["collective_scratch"] == round(1.5 * gradient) and jax_full.peak_phase == "backward"
    assert jax_full.total_bytes - jax_full.phase_bytes("states") == jax_full.phase_bytes("backward")
    assert all(run(fw, s)["collective_scratch"] == 0 for fw, s in
               (("mlx", "fsdp-full"), ("jax", "ddp"), ("jax", "fsdp-row"), ("mlx", "ddp")))
    spec = tiny_spec("bfloat16")
    plan = plan_buckets(spec, 256)
    est = estimate_memory(spec, "zero3", 4, bucket_plan=plan, collective_scratch=1.5)
    assert plan.num_buckets > 1 and est["collective_scratch"] == round(1.5 * plan.bucket_elems.max() * 2)  # bf16
    assert estimate_memory(spec, "zero3", 1, collective_scratch=1.5)["collective_scratch"] == 0  # no peers
    assert estimate_memory(spec, "zero2", 4, collective_scratch=1.5)["collective_scratch"] == 0  # not in backward
    for bad in (-1, float("nan"), "1.5", True):
        with pytest.raises(ValueError, match="collective_scratch must be a number"):
            estimate_memory(spec, "zero3", 4, collective_scratch=bad)

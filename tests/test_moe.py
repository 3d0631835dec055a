"""Mixture-of-experts: experts sharded by FSDP or by expert parallelism, and deferred sync for them, by hand formula."""

import plotly.graph_objects as go
import pytest

from workbench.core.presets import get_preset
from workbench.estimate.breakdown import MODEL_STATES
from workbench.estimate.memory import estimate_memory
from workbench.estimate.moe import expert_params, policy_label
from workbench.studies.moe import GB, moe_memory_table, moe_rank_layout, moe_summary
from workbench.studies.moe_figures import fig_moe_memory_vs_shards, fig_moe_rank_layout

# tiny-moe (hidden 64, 2 blocks, 4 experts of width 128, vocab 256, untied head), by hand:
EMBEDDING = 2 * 256 * 64  # embed_tokens and lm_head
ATTENTION = 2 * (64 * 64 + 32 * 64 + 32 * 64 + 64 * 64)  # q, k, v (2 KV heads of 16), o
ROUTER = 2 * 4 * 64  # block_sparse_moe.gate: the router is no expert
EXPERTS = 2 * 4 * 3 * 128 * 64  # w1, w2, w3 of 4 experts in 2 blocks
NORMS = 2 * 2 * 64 + 64
PSI_E, PSI_D = EXPERTS, EMBEDDING + ATTENTION + ROUTER + NORMS
BLOCK = (ATTENTION + ROUTER + 2 * 2 * 64) // 2  # one block without its experts
STATE_BYTES = 2 + 2 + 4 + 8  # bf16 parameters and gradients, fp32 master, fp32 AdamW m and v


def tiny():
    return get_preset("tiny-moe")


def test_tiny_moe_counts():
    spec = tiny()
    assert expert_params(spec) == PSI_E and spec.num_params == PSI_E + PSI_D == 254_784


def test_experts_sharded_by_fsdp_is_the_model_without_the_knob():
    spec = tiny()
    for strategy in ("ddp", "fsdp", "zero2", "zero3"):
        assert estimate_memory(spec, strategy, 8, expert_parallel=None) == estimate_memory(spec, strategy, 8)
    row = moe_memory_table("tiny-moe", 8, (None,)).iloc[0]
    old = estimate_memory(spec, "zero3", 8)
    assert (row.parameters_bytes, row.total_bytes) == (old["parameters"], old.total_bytes)
    assert row.parameters_bytes == -(-(PSI_E + PSI_D) * 2 // 8)
    # ZeRO-3: 16 B per parameter over N, plus one gathered block (experts included) in 16 bit
    assert row.total_bytes == STATE_BYTES * (PSI_E + PSI_D) // 8 + (BLOCK + PSI_E // 2) * (2 + 2)


@pytest.mark.parametrize("n", [1, 2, 8])
def test_experts_replicated_hold_nonexpert_over_n_plus_every_expert(n):
    est = estimate_memory(tiny(), "zero3", n, expert_parallel=1)
    for name, nbytes in (("parameters", 2), ("gradients", 2), ("master_weights", 4), ("optimizer_state", 8)):
        assert est[name] == -(-PSI_D * nbytes // n) + PSI_E * nbytes, name
        formula = next(c.formula for c in est.components if c.name == name)
        assert f"{PSI_D:,} non-expert / {n}" in formula and f"{PSI_E:,} expert / 1" in formula
    assert "non-expert" in next(c.formula for c in est.components if c.name == "fp32_gradients")
    # the gathered unit is the largest block without its experts: here the root (embedding, head, final norm)
    assert est["gathered_unit"] == (EMBEDDING + 64) * (2 + 2)
    assert est.total_bytes == est.model_state_bytes + est["gathered_unit"]


def test_expert_parallel_divides_the_experts_only():
    spec, n = tiny(), 8
    for k in (1, 2, 4):
        est = estimate_memory(spec, "zero3", n, expert_parallel=k)
        assert est.model_state_bytes == STATE_BYTES * PSI_D // n + STATE_BYTES * PSI_E // k
    # the strategy still decides the non-expert part: DDP replicates it, FSDP (MLX's) shards the optimizer side
    ddp = estimate_memory(spec, "ddp", n, expert_parallel=4)
    assert ddp["parameters"] == 2 * PSI_D + 2 * PSI_E // 4 and ddp["optimizer_state"] == 8 * PSI_D + 8 * PSI_E // 4
    fsdp = estimate_memory(spec, "fsdp", n, expert_parallel=1)
    assert fsdp["parameters"] == 2 * (PSI_D + PSI_E) and fsdp["optimizer_state"] == 8 * PSI_D // n + 8 * PSI_E


def test_accumulator_of_experts_outside_fsdp_is_theirs_whatever_the_mode():
    spec, n = tiny(), 8
    every = estimate_memory(spec, "zero3", n, expert_parallel=2, num_microbatches=4, defer_sync=False)
    deferred = estimate_memory(spec, "zero3", n, expert_parallel=2, num_microbatches=4, defer_sync=True)
    assert every["gradient_accumulator"] == -(-2 * PSI_D // n) + 2 * PSI_E // 2
    assert deferred["gradient_accumulator"] == 2 * PSI_D + 2 * PSI_E // 2
    # deferral gathers the FSDP-sharded parameters only; experts are local already
    assert deferred["gathered_unit"] == 2 * PSI_D + 2 * PSI_D - -(-2 * PSI_D // n)


def test_memory_table_columns_and_ratios():
    t = moe_memory_table("tiny-moe", 8, (None, 1, 4))
    assert list(t.policy) == [policy_label(k) for k in (None, 1, 4)]
    assert list(t.expert_parallel) == [None, 1, 4]
    assert (t.expert_share == PSI_E / (PSI_E + PSI_D)).all()
    assert list(t.parameters_bytes) == [-(-(PSI_E + PSI_D) * 2 // 8), -(-PSI_D * 2 // 8) + 2 * PSI_E,
                                        -(-PSI_D * 2 // 8) + 2 * PSI_E // 4]
    assert list(t.optimizer_state_bytes) == [12 * (PSI_E + PSI_D) // 8, 12 * PSI_D // 8 + 12 * PSI_E,
                                             12 * PSI_D // 8 + 12 * PSI_E // 4]
    assert t.total_vs_first.iloc[0] == 1 and t.total_vs_first.iloc[1] > t.total_vs_first.iloc[2] > 1
    knobs = moe_memory_table("tiny-moe", 8, (1,), strategy="fsdp", optimizer="sgd", master_dtype=None).iloc[0]
    assert knobs.optimizer_state_bytes == 0 and knobs.parameters_bytes == 2 * (PSI_D + PSI_E)


def test_rank_layout_sums_to_the_model_states():
    spec = tiny()
    for k in (None, 1, 4):
        layout = moe_rank_layout("tiny-moe", 8, k)
        est = estimate_memory(spec, "zero3", 8, expert_parallel=k)
        assert layout.model_state_bytes.sum() == pytest.approx(est.model_state_bytes, abs=5 * len(layout) * 16)
        assert set(layout.kind) == {"embedding", "attention", "mlp", "expert", "norm"}
        expert = layout[layout.kind == "expert"].iloc[0]
        assert expert.held_as == ("fsdp" if k is None else "experts")
        assert expert.model_state_bytes == (STATE_BYTES * PSI_E // 8 if k is None else STATE_BYTES * PSI_E // k)
        assert (layout[layout.kind != "expert"].held_as == "fsdp").all()
    assert "replicated" in moe_rank_layout("tiny-moe", 8, 1).description.iloc[3]
    assert "2 whole experts of 4" in moe_rank_layout("tiny-moe", 8, 2).description.iloc[3]


def test_rank_layout_figure_shows_shards_and_whole_experts():
    fig = fig_moe_rank_layout("tiny-moe", 8, 1)
    go.Figure(fig.to_dict())  # valid plotly
    traces = {t.name: t for t in fig.data}
    assert {"embedding", "attention", "mlp", "expert", "norm", "expert (whole experts, outside FSDP)"} == set(traces)
    sharded, replicated = policy_label(None), policy_label(1)
    assert list(traces["expert"].y) == [sharded, replicated]
    assert list(traces["expert"].x) == pytest.approx([STATE_BYTES * PSI_E / 8 / GB, 0.0])
    whole = traces["expert (whole experts, outside FSDP)"]
    assert list(whole.x) == pytest.approx([0.0, STATE_BYTES * PSI_E / GB]) and whole.marker.pattern.shape == "x"
    totals = [sum(t.x[i] for t in fig.data) for i in range(2)]
    for total, k in zip(totals, (None, 1)):
        assert total == pytest.approx(moe_rank_layout("tiny-moe", 8, k).model_state_bytes.sum() / GB)


def test_memory_vs_shards_figure_draws_the_table():
    fig = fig_moe_memory_vs_shards("tiny-moe", (2, 8), (None, 1, 4))
    go.Figure(fig.to_dict())
    assert [t.name for t in fig.data] == [policy_label(k) for k in (None, 1, 4)]
    for trace, k in zip(fig.data, (None, 1, 4)):
        assert list(trace.x) == ["N=2", "N=8"]
        want = [moe_memory_table("tiny-moe", n, (k,)).total_bytes.iloc[0] / GB for n in (2, 8)]
        assert list(trace.y) == pytest.approx(want)


def test_summary_headline_numbers():
    s = moe_summary("tiny-moe", 8, 1)
    assert s.expert_share == pytest.approx(PSI_E / (PSI_E + PSI_D))
    assert s.expert_states_bytes == STATE_BYTES * PSI_E
    assert s.excluded_total_bytes == moe_memory_table("tiny-moe", 8, (1,)).total_bytes.iloc[0]
    assert s.excluded_over_sharded == pytest.approx(s.excluded_total_bytes / s.sharded_total_bytes)
    assert s.excluded_over_sharded > 3
    mixtral = moe_summary("mixtral-8x7b", 8, 1)
    assert 0.96 < mixtral.expert_share < 0.97  # 45.1B of 46.7B parameters are experts
    assert mixtral.excluded_over_sharded > 7  # replicating the experts undoes nearly all of FSDP's 8x
    # EP degree = N: the same model states; the peak is lower by the experts ZeRO-3 no longer gathers
    ep8 = moe_summary("mixtral-8x7b", 8, 8)
    assert ep8.excluded_model_state_bytes == ep8.sharded_model_state_bytes
    block = get_preset("mixtral-8x7b").num_params - 2 * 32000 * 4096 - 4096  # 32 blocks, without embeddings
    root = 2 * 32000 * 4096 + 4096
    assert ep8.sharded_total_bytes - ep8.excluded_total_bytes == (block // 32 - root) * (2 + 2)


@pytest.mark.parametrize("call, knob", [
    (lambda: estimate_memory(10**6, "zero3", 8, expert_parallel=1), "expert_parallel"),  # a bare count
    (lambda: estimate_memory(get_preset("tiny-llama"), "zero3", 8, expert_parallel=1), "expert_parallel"),  # dense
    (lambda: estimate_memory(tiny(), "zero3", 8, expert_parallel=0), "expert_parallel"),
    (lambda: estimate_memory(tiny(), "zero3", 8, expert_parallel=1.5), "expert_parallel"),
    (lambda: moe_memory_table("gpt2", 8), "preset_name"),
    (lambda: moe_memory_table("no-such-model", 8), "preset_name"),
    (lambda: moe_memory_table("tiny-moe", 8, (None, 3)), "expert_parallel"),  # 3 does not divide 4 experts
    (lambda: moe_memory_table("tiny-moe", 8, ()), "expert_parallel_degrees"),
    (lambda: moe_memory_table("tiny-moe", 0), "num_shards"),
    (lambda: moe_memory_table("tiny-moe", 8, strategy="zero4"), "strategy"),
    (lambda: moe_rank_layout("tiny-moe", 8, 1, strategy="zero4"), "strategy"),
    (lambda: fig_moe_rank_layout("tiny-moe", 8, None), "expert_parallel"),
    (lambda: fig_moe_memory_vs_shards("tiny-moe", ()), "num_shards"),
    (lambda: moe_summary("tiny-moe", 8, None), "expert_parallel"),
])
def test_bad_input_names_the_knob(call, knob):
    with pytest.raises(ValueError, match=knob):
        call()


def test_model_states_are_the_five_zero_terms():
    assert MODEL_STATES == ("parameters", "gradients", "master_weights", "optimizer_state", "fp32_gradients")


def test_deferred_sync_as_the_mixin_does_holds_the_experts_gathered_and_their_gradients_unsharded():
    from workbench.studies.moe import moe_accumulation_table

    n = 4
    t = moe_accumulation_table("tiny-moe", n, 4, (None, 4), param_dtype="bfloat16")
    assert list(t["mode"]) == ["G = 1", "every micro-batch", "deferred (the mixin)"] * 2
    spec = get_preset("tiny-moe", "bfloat16")
    psi, psi_e = spec.num_params, expert_params(spec)
    fsdp = t[t.policy == policy_label(None)].set_index("mode")
    # Experts sharded by FSDP: deferral holds the whole model's gradient unsharded (bf16), every micro-batch 1/N.
    assert fsdp.loc["deferred (the mixin)", "accumulator_bytes"] == 2 * psi
    assert fsdp.loc["every micro-batch", "accumulator_bytes"] == -(-2 * psi // n)
    assert fsdp.loc["G = 1", "accumulator_bytes"] == 0
    assert fsdp.loc["deferred (the mixin)", "total_bytes"] > fsdp.loc["every micro-batch", "total_bytes"]
    ep = t[t.policy == policy_label(4)].set_index("mode")
    # Experts sharded by EP=4: a rank accumulates only its own experts' gradients, so deferral costs less.
    assert ep.loc["deferred (the mixin)", "accumulator_bytes"] == 2 * (psi - psi_e) + -(-2 * psi_e // 4)
    assert ep.loc["deferred (the mixin)", "total_vs_g1"] < fsdp.loc["deferred (the mixin)", "total_vs_g1"]
    with pytest.raises(ValueError, match="num_microbatches must be an integer >= 2"):
        moe_accumulation_table("tiny-moe", n, 1)


def test_the_summary_table_has_a_row_per_preset_and_degree():
    from workbench.studies.moe import moe_summary_table

    t = moe_summary_table(["tiny-moe"], 4, [1, 4])
    assert list(t["EP degree"]) == [1, 4] and (t.ratio > 0).all()
    assert t["model states ratio"].iloc[1] == pytest.approx(1.0, rel=0.02)  # EP = N: the experts' 1/N either way

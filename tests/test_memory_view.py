"""Memory figures carry the model's numbers; the explorer redraws on every control; bad input names the knob."""

import math
import re

import pandas as pd
import plotly.graph_objects as go
import pytest

from workbench.core.presets import get_preset
from workbench.core.units import format_number
from workbench.estimate.breakdown import PHASES
from workbench.estimate.cases import ZERO_FIGURE_1, estimator_table, explain_qwen_3_7b, zero_figure_1_table
from workbench.estimate.grid import estimate_breakdowns
from workbench.estimate.memory import estimate_memory
from workbench.views.memory import (
    UNITS,
    breakdown_summary,
    fig_memory_breakdown,
    fig_memory_validation,
    fig_qwen_gap,
    fig_zero_figure_1,
    over_capacity,
    peak_label,
)
from workbench.views.memory_explorer import build_memory_explorer


def bars(fig) -> dict[str, list[float]]:
    """``{component: y}`` of the drawn bar traces (an explorer's widget keeps hidden spare ones)."""
    return {t.name: list(t.y) for t in fig.data if t.type == "bar" and t.visible is not False}


def trace(fig, name_start: str):
    return next(t for t in fig.data if t.visible is not False and t.name.startswith(name_start))


def stacked_totals(fig) -> list[float]:
    return [sum(col) for col in zip(*bars(fig).values())]


def test_breakdown_bars_are_the_estimate_rows_and_sum_to_the_peak():
    estimates = estimate_breakdowns("gpt2", ("ddp", "fsdp", "zero3"), (2, 8), seq_len=256,
                                    update_copies="parameters")
    fig = fig_memory_breakdown(estimates, unit="MiB")
    go.Figure(fig.to_dict())  # valid plotly
    shown = bars(fig)
    for k, e in enumerate(estimates):
        for name, y in shown.items():
            drawn = name in PHASES["states"] or name in PHASES[e.peak_phase]
            assert y[k] == pytest.approx(e[name] / 2**20 if drawn else 0.0)
    assert stacked_totals(fig) == pytest.approx([e.total_bytes / 2**20 for e in estimates])
    for phase in ("step", "backward"):
        peak, mine = trace(fig, f"peak, set by {phase}"), [e for e in estimates if peak_label(e) == phase]
        assert list(peak.y) == pytest.approx([e.total_bytes / 2**20 for e in mine]) and mine
        assert list(peak.x[0]) == [e.strategy for e in mine] and list(peak.x[1]) == [f"N={e.num_shards}" for e in mine]
    assert list(fig.data[0].x[0]) == ["ddp"] * 2 + ["fsdp"] * 2 + ["zero3"] * 2
    assert list(fig.data[0].x[1]) == ["N=2", "N=8"] * 3
    # DDP's step (averaged gradients + a new tree) is drawn only when it beats backward, and vice versa
    other = trace(fig, "other transient")
    for e, y in zip(estimates, other.y):
        off = e.phase_bytes("backward" if e.peak_phase == "step" else "step")
        assert (y is None) if not off else y == pytest.approx((e.phase_bytes("states") + off) / 2**20)


def test_breakdown_activations_follow_micro_batch_and_seq_len():
    small, big = (estimate_breakdowns("gpt2", ("ddp",), (8,), seq_len=s, micro_batch_size=b)[0]
                  for s, b in ((128, 1), (256, 4)))
    assert big["activations"] > 4 * small["activations"] > 0
    assert small["parameters"] == big["parameters"]


def test_zero_figure_1_reproduced_and_drawn():
    table = zero_figure_1_table()
    assert table.matches_paper.all()
    assert table.paper_gb.tolist() == [120.0, 31.4, 16.6, 1.9]
    assert table.workbench_gb.tolist() == pytest.approx([120.0, 31.40625, 16.640625, 1.875])
    fig = fig_zero_figure_1()
    assert stacked_totals(fig) == pytest.approx(table.workbench_gb.tolist())
    assert list(trace(fig, "paper").y) == [v[2] for v in ZERO_FIGURE_1.values()]
    assert list(fig.data[0].x[0]) == ["Baseline", "P_os", "P_os+g", "P_os+g+p"]
    assert list(trace(fig, "peak, set by states only").text) == ["120", "31.4", "16.6", "1.88"]
    assert not any(t.name.startswith(("peak, set by step", "peak, set by backward")) for t in fig.data)


def test_qwen_gap_figure_carries_the_gap():
    gap = explain_qwen_3_7b()
    fig = fig_qwen_gap(gap)
    go.Figure(fig.to_dict())
    left = {t.name: list(t.y) for t in fig.data if t.type == "bar"}
    # each stacked bar is the measured peak: modelled rows + unmodelled
    assert [sum(col) for col in zip(*left.values())] == pytest.approx(
        [gap.measured_baseline_bytes / 1e9, gap.measured_candidate_bytes / 1e9])
    assert left["optimizer_state"] == pytest.approx([29.6, 3.7])
    fall = next(t for t in fig.data if t.type == "waterfall")
    steps = dict(zip(fall.x, fall.y))
    assert steps["optimizer_state (predicted)"] == pytest.approx(-25.9)
    assert steps["residual (unexplained)"] == pytest.approx(-gap.residual_bytes / 1e9)
    assert sum(y for y, m in zip(fall.y, fall.measure) if m != "total") == pytest.approx(
        gap.measured_candidate_bytes / 1e9)
    assert abs(gap.residual_bytes) / gap.measured_difference_bytes < 0.10


def test_estimator_table_names_every_source():
    table = estimator_table(7_000_000_000, 8, largest_layer_params=200_000_000)
    s2 = table[table.stage == 2].set_index("source").gb
    assert s2.to_dict() == pytest.approx({"ZeRO paper": 26.25, "Ultra-Scale Playbook": 26.25, "DeepSpeed code": 29.75,
                                          "DeepSpeed docs": 42.0, "workbench": 29.75})
    assert (table.gib * 2**30).tolist() == pytest.approx((table.gb * 1e9).tolist())
    assert table.reason.str.len().min() > 20


def validation_table(peak_ratio=0.97, within=True):
    rows = []
    for run, fw, strategy in (("mlx ddp", "mlx", "ddp"), ("jax fsdp-full", "jax", "fsdp-full")):
        for comp, pred, tol in (("parameters", 100, 0.05), ("optimizer_state", 200, 0.05), ("peak", 1000, 0.10)):
            if fw == "jax" and comp == "peak":
                tol = None
            for rank, r in ((0, 1.0), (1, peak_ratio if comp == "peak" else 1.0)):
                rows.append(dict(run=run, run_id=run, framework=fw, strategy=strategy, rank=rank, component=comp,
                                 predicted_bytes=pred * 2**20, measured_bytes=int(pred * r * 2**20), ratio=r,
                                 tolerance=tol, within=None if tol is None else within, source="test"))
    return pd.DataFrame(rows)


def test_validation_figure_shows_worst_rank_and_tolerance():
    fig = fig_memory_validation(validation_table())
    go.Figure(fig.to_dict())
    measured = [t for t in fig.data if t.name == "measured"]
    predicted = [t for t in fig.data if t.name.startswith("predicted")]
    assert len(measured) == len(predicted) == 3
    peak_bars, peak_pred = measured[2], predicted[2]
    assert list(peak_bars.x) == ["jax fsdp-full", "mlx ddp"]
    assert list(peak_bars.y) == pytest.approx([970, 970])  # the worst rank, in MiB
    assert list(peak_bars.text) == ["0.970", "0.970"]
    assert list(peak_pred.error_y.array) == pytest.approx([0, 100])  # no target for JAX's peak; 10% for MLX
    assert list(predicted[0].error_y.array) == pytest.approx([5, 5])


def test_explorer_redraws_when_a_control_changes():
    explorer = build_memory_explorer("gpt2", num_shards=(2, 8), seq_len=512)
    want = estimate_breakdowns("gpt2", num_shards=(2, 4, 8), seq_len=512)
    assert stacked_totals(explorer.figure) == pytest.approx([e.total_bytes / 1e9 for e in want])
    assert explorer.status.value == breakdown_summary(want) == "N=8: " + ", ".join(
        f"{e.strategy} {format_number(e.total_bytes / 1e9)} GB ({peak_label(e)})" for e in want if e.num_shards == 8)
    explorer.controls["optimizer"].value = "sgd"
    assert "optimizer_state" not in bars(explorer.figure)  # SGD keeps no state: no bar at all
    explorer.controls["seq_len"].value = 1024
    explorer.controls["micro_batch_size"].value = 4
    want = estimate_breakdowns("gpt2", num_shards=(2, 4, 8), optimizer="sgd", seq_len=1024, micro_batch_size=4)
    assert stacked_totals(explorer.figure) == pytest.approx([e.total_bytes / 1e9 for e in want])
    assert bars(explorer.figure)["activations"][0] == pytest.approx(want[0]["activations"] / 1e9)
    explorer.controls["num_shards"].value = (16, 64)
    assert list(explorer.figure.data[0].x[1]) == ["N=16", "N=32", "N=64"] * 5
    explorer.controls["param_dtype"].value = "float32"
    explorer.controls["master_dtype"].value = "none"
    assert "master_weights" not in bars(explorer.figure)
    assert explorer.controls["master_dtype"].label == "none" and explorer.controls["master_dtype"].index == 0
    explorer.controls["model"].value = "qwen3-4b"
    assert explorer.estimates[0].num_params == get_preset("qwen3-4b").num_params
    explorer.controls["seq_len"].value = 128
    explorer.controls["micro_batch_size"].value = 1
    explorer.controls["update_copies"].value = "parameters"  # the new tree now outweighs the activations
    assert "updated_parameters" in bars(explorer.figure)
    phases = {(e.strategy, e.peak_phase) for e in explorer.estimates}
    assert ("ddp", "step") in phases and ("zero3", "backward") in phases  # ZeRO-3: the gathered embedding wins


def test_master_dtype_none_stays_selected_and_reaches_the_model():
    """Issue 18: picking "none" drew a blank dropdown (a Dropdown whose value is None has nothing selected)."""
    explorer = build_memory_explorer("gpt2", num_shards=(2, 8), seq_len=256, master_dtype=None)
    control = explorer.controls["master_dtype"]
    assert (control.value, control.label, control.index) == ("none", "none", 0)
    assert "master_weights" not in bars(explorer.figure)
    control.value = "float32"
    assert "master_weights" in bars(explorer.figure)
    control.label = "none"  # what a click on the option does
    assert control.index == 0 and "master_weights" not in bars(explorer.figure)


def test_breakdown_legend_is_beside_the_plot_and_numbers_do_not_run_together():
    """Issue 18: the legend covered the strategy names; seven N ran the peak numbers together ("159159159")."""
    estimates = estimate_breakdowns("llama-3-8b", num_shards=tuple(2**k for k in range(3, 10)))
    fig = fig_memory_breakdown(estimates)
    assert fig.layout.legend.orientation == "v" and fig.layout.legend.x > 1  # right of the plot, off the x axis
    texts = [(x0, x1, text, pos) for t in fig.data if t.name.startswith("peak")
             for x0, x1, text, pos in zip(t.x[0], t.x[1], t.text, t.textposition)]
    shown = [(x0, x1, pos) for x0, x1, text, pos in texts if text]
    assert len(texts) == 35 and len(shown) == 10  # the smallest and largest N of each of the five strategies
    assert {(x1, pos) for _, x1, pos in shown} == {("N=8", "top right"), ("N=512", "top left")}
    assert "numbers at the smallest and largest N" in fig.layout.title.text
    two = fig_memory_breakdown(estimate_breakdowns("llama-3-8b", num_shards=(8, 64, 512)))
    assert all(text for t in two.data if t.name.startswith("peak") for text in t.text)


def test_one_capacity_line_and_one_test_of_who_is_over_it_serve_the_figure_the_explorer_and_the_deck():
    """Issue 25: the explorer drew its own capacity line and named who does not fit; the breakdown figure and the
    deck's memory assumptions did each again. One line (capacity_trace, through fig_memory_breakdown), one test
    (over_capacity)."""
    from workbench.studies.deck_findings import memory_assumptions
    from workbench.views.memory_explorer import capacity_html, fig_memory_explorer

    est = estimate_breakdowns("llama-3-8b", ["ddp", "fsdp", "zero3"], [8, 64], micro_batch_size=1, seq_len=2048)
    over = over_capacity(est, 80e9)
    assert [(e.strategy, e.num_shards) for e in over] == [(e.strategy, e.num_shards) for e in est if e.total_bytes > 80e9]
    assert ("ddp", 8) in [(e.strategy, e.num_shards) for e in over] and len(over) < len(est)
    assert over_capacity(est, math.inf) == [] and over_capacity(est, 0) == list(est)
    fig = fig_memory_breakdown(est, capacity_bytes=80e9, capacity_label="an H100's memory")
    line = trace(fig, "an H100's memory")
    assert line.name == "an H100's memory 80 GB" and line.mode == "lines" and line.line.dash == "dash"
    assert [list(level) for level in line.x] == [list(level) for level in fig.data[0].x]  # across every bar
    assert list(line.y) == [80.0] * len(est) and not fig.layout.shapes
    in_mib = trace(fig_memory_breakdown(est, unit="MiB", capacity_bytes=80e9), "device")
    assert in_mib.name == f"device {format_number(80e9 / 2**20)} MiB" and in_mib.y[0] == pytest.approx(80e9 / 2**20)
    assert not [t for t in fig_memory_breakdown(est).data if t.name.startswith("device")]  # no capacity, no line
    explorer = fig_memory_explorer(est, 80e9, 900)  # the explorer draws the same line, as "device memory"
    drawn = trace(explorer, "device memory")
    same = trace(fig_memory_breakdown(est, capacity_bytes=80e9, capacity_label="device memory"), "device memory")
    assert drawn.name == "device memory 80 GB" and drawn.to_plotly_json() == same.to_plotly_json()
    # who does not fit: the explorer's warning (at the largest N) and the deck name exactly over_capacity's
    warned = capacity_html(est, 1, 80e9)
    for e in est:
        if e.num_shards == 64:
            assert (f"{e.strategy} needs" in warned) == (e in over_capacity(est, 80e9))
    at_8 = [e for e in est if e.num_shards == 8]
    said = memory_assumptions(at_8, micro_batch_size=1, seq_len=2048, capacity_bytes=80e9)
    assert said.endswith("over it: " + ", ".join(f"{e.strategy} ({e.total_bytes / 1e9:,.1f} GB)"
                                                  for e in over_capacity(at_8, 80e9)) + ".")


@pytest.mark.parametrize("call, knob", [
    (lambda: estimate_breakdowns("gpt-5"), "model"),
    (lambda: estimate_breakdowns("gpt2", num_shards=(0,)), "num_shards"),
    (lambda: estimate_breakdowns("gpt2", ("zero4",)), "strategy"),
    (lambda: estimate_breakdowns("gpt2", seq_len=-1), "seq_len"),
    (lambda: estimate_breakdowns("gpt2", param_dtype="float7"), "param_dtype"),
    (lambda: fig_memory_breakdown([]), "estimates"),
    (lambda: fig_memory_breakdown([estimate_memory(10, "ddp")], unit="furlong"), "unit"),
    (lambda: fig_memory_validation(validation_table().iloc[0:0]), "table"),
    (lambda: build_memory_explorer("gpt2", num_shards=(3, 8)), "num_shards"),
    (lambda: build_memory_explorer("gpt2", num_shards=(64, 8)), "num_shards"),
    (lambda: build_memory_explorer("gpt2", master_dtype="bfloat16"), "master_dtype"),
    (lambda: build_memory_explorer("nope"), "model"),
])
def test_bad_input_names_the_knob(call, knob):
    with pytest.raises(ValueError, match=knob):
        call()


def test_units_are_bytes():
    assert UNITS["GB"] == 10**9 and UNITS["GiB"] == 2**30 and math.log2(UNITS["MiB"]) == 20


def test_memory_explorer_takes_a_users_spec_or_config_and_shows_its_call():
    """Explorers take the user's model wherever a preset name goes; 'copy these settings as code'."""
    from workbench.core.hf_config import spec_from_hf_config  # noqa: F401  (the config path the explorer uses)

    explorer = build_memory_explorer("gpt2", num_shards=(2, 8), seq_len=256)
    line = explorer.code_line()
    assert line == ("build_memory_explorer('gpt2', param_dtype='bfloat16', master_dtype='float32', optimizer='adamw', "
                    "update_copies='none', micro_batch_size=1, seq_len=256, num_shards=(2, 8))")
    again = eval(line, {"build_memory_explorer": build_memory_explorer})
    assert stacked_totals(again.figure) == pytest.approx(stacked_totals(explorer.figure))
    spec = get_preset("gpt2", "float32")  # as spec_from_mlx would hand it: shapes only
    mine = build_memory_explorer(spec, num_shards=(2, 8), seq_len=256)
    assert mine.controls["model"].label == "gpt2 (given)" and mine.estimates[0].num_params == spec.num_params
    assert "activations not counted" in mine.status.value
    assert mine.code_line().startswith("build_memory_explorer(model, ")


def test_memory_explorer_status_reads_for_people_and_takes_the_activation_levers():
    """Issue 29 item 5: the status read "361318.45 GB"; recompute and fused attention, the levers notebook 03
    names, were missing."""
    explorer = build_memory_explorer("llama-3-8b", num_shards=(8, 8), micro_batch_size=64, seq_len=32768)
    assert explorer.status.value.startswith("N=8: ddp 361,000 GB (backward), ")
    assert not re.search(r"\d{4}\.\d", explorer.status.value)  # no long raw decimals
    explorer.controls["fused_attention"].value = True
    explorer.controls["recompute"].value = True
    want = estimate_breakdowns("llama-3-8b", num_shards=(8,), micro_batch_size=64, seq_len=32768,
                               recompute=True, fused_attention=True)
    assert bars(explorer.figure)["activations"][0] == pytest.approx(want[0]["activations"] / 1e9)
    assert want[0]["activations"] == 32 * 2 * 32768 * 64 * 4096 + 34 * 32768 * 64 * 4096  # inputs + one layer
    assert explorer.status.value.startswith("N=8: ddp 970 GB (backward), ")
    line = explorer.code_line()
    assert "recompute=True, fused_attention=True" in line
    again = eval(line, {"build_memory_explorer": build_memory_explorer})
    assert stacked_totals(again.figure) == pytest.approx(stacked_totals(explorer.figure))


def test_a_jax_peak_without_a_truth_is_shown_not_held_and_a_missed_peak_names_its_term():
    """The committed reference runs predate the JAX truth: their JAX peak is XLA's plan, shown (grey) with no
    target; a missed peak's cause names the term that is off (with a plan: the plan against the estimate, the
    measurement against the plan; without one: the estimate's peak phase), and the figure's hover carries it."""
    from workbench.runs.estimate import estimate_run_memory
    from workbench.runs.tables import load_runs
    from workbench.studies.design_review import reference_runs_dir
    from workbench.studies.memory import memory_validation, peak_cause

    table = memory_validation(load_runs(reference_runs_dir("memory")))
    peaks = table[table.component == "peak"]
    jax, mlx = peaks[peaks.framework == "jax"], peaks[peaks.framework == "mlx"]
    assert len(jax) == 4 and jax.tolerance.isna().all() and jax.within.isna().all() and (jax.cause == "").all()
    assert jax.source.str.startswith("XLA").all() and (jax.plan_bytes == jax.measured_bytes).all()
    assert mlx.within.all() and mlx.plan_bytes.isna().all() and (mlx.cause == "").all()
    estimate = estimate_run_memory(dict(framework="jax", strategy="fsdp-full", num_ranks=2, precision="float32",
                                        optimizer="adamw", global_batch=8, communication_size=2**20,
                                        model=dict(vocab_size=64, seq_len=32, dim=64, num_layers=2, num_heads=4,
                                                   mlp_dim=128)))
    total, scratch = estimate.total_bytes, estimate["collective_scratch"]
    # gloo's reduce-scatter scratch (1.5 x the largest bucket's gradient) is the estimate's, outside XLA's plan
    assert scratch == round(1.5 * 4 * estimate_run_largest_bucket_elems()) and estimate.peak_phase == "backward"
    gloo = peak_cause(estimate, int(1.3 * total), total - scratch, 0.10)  # the plan right, the rank 30% beyond both
    assert gloo == ("the rank held +30% against XLA's plan and the collective scratch (buffers outside the compiled "
                    "step beyond the estimate's collective scratch)")
    plan = int(0.8 * (total - scratch))
    schedule = peak_cause(estimate, plan + scratch, plan, 0.10)
    assert schedule.startswith("XLA's plan of the step is 0.80 of the estimate: its schedule holds less than the "
                               "estimate's backward phase (gathered unit, activations)") and "against" not in schedule
    mlx_like = peak_cause(estimate, int(1.2 * total), None, 0.10)  # no plan: the estimate's peak phase
    assert mlx_like.startswith(f"the estimate's {estimate.peak_phase} phase (")
    missed = table.assign(within=table.within.where(table.component != "peak", False),
                          cause=table.cause.where(table.component != "peak", "the term"))
    hover = [t["customdata"] for t in fig_memory_validation(missed).data if t.customdata is not None]
    assert any("<br>the term" in c for cs in hover for c in cs)


def estimate_run_largest_bucket_elems() -> int:
    """The largest bucket of the JAX ZeRO-3 case above, at its communication_size of 1 MiB."""
    from workbench.core.buckets import plan_buckets
    from workbench.runs.estimate import run_model_spec

    model = run_model_spec(dict(framework="jax", precision="float32", model=dict(
        vocab_size=64, seq_len=32, dim=64, num_layers=2, num_heads=4, mlp_dim=128)), None)
    return int(plan_buckets(model, 2**20).bucket_elems.max())


def test_a_groups_worst_row_is_a_held_one_and_only_a_missed_peak_has_a_cause():
    """A store that mixes a JAX run whose peak is XLA's plan (shown only) with one that read its truth: the group's
    worst row is the held one, so a plan 30% off is not called a miss; and a missed parameters row gets no cause
    (the cause names a term of the peak)."""
    import copy

    from workbench.runs.tables import load_runs
    from workbench.studies.design_review import reference_runs_dir
    from workbench.studies.memory import memory_validation, memory_validation_summary

    table = validation_table(peak_ratio=1.3)  # jax fsdp-full's peak: shown only, its rank 1 at 1.3
    held = table[(table.run == "jax fsdp-full") & (table.component == "peak")].assign(
        rank=2, ratio=1.02, tolerance=0.10, within=True, source="VmHWM")
    mixed = pd.concat([table, held], ignore_index=True)
    summary = memory_validation_summary(mixed.assign(cause=""))
    row = summary[(summary.framework == "jax") & (summary.component == "peak")].iloc[0]
    assert (round(row.worst_error, 6), row.tolerance, row.within) == (0.02, 0.10, True)
    fig = fig_memory_validation(mixed)
    peak_bars = [t for t in fig.data if t.type == "bar" and t.xaxis == fig.data[-1].xaxis]
    assert dict(zip(peak_bars[0].x, peak_bars[0].text))["jax fsdp-full"] == "1.020"  # not the plan's 1.300
    loaded = load_runs(reference_runs_dir("memory"))
    i = loaded.runs.index[loaded.runs["spec.strategy"] == "fsdp-row"][0]
    ranks = copy.deepcopy(loaded.runs.at[i, "summary.ranks"])
    ranks[0]["measured_memory"]["parameters"] *= 2
    loaded.runs.at[i, "summary.ranks"] = ranks
    validation = memory_validation(loaded)
    doubled = validation[(validation.run_id == loaded.runs.at[i, "run_id"]) & (validation.component == "parameters")
                         & (validation["rank"] == 0)].iloc[0]
    assert doubled.within is False and doubled.cause == ""


def test_a_runs_peak_is_its_highest_truth_and_a_plan_is_shown_beside_what_a_plan_can_hold():
    """One rule for the accumulation study and notebook 07: the highest rank among those that read their truth
    (a rank whose stored peak is XLA's plan counts only where none did), held to 10% of the estimate; a plan is
    set beside the estimate less gloo's scratch, with no verdict."""
    from workbench.runs.estimate import estimate_run_memory
    from workbench.studies.memory import highest_peak, in_plan_bytes, judge_peak

    plan_only = {"peak": 900, "peak_source": "XLA memory_analysis"}
    truth = {**plan_only, "truth_peak": 500, "truth_source": "VmHWM"}
    assert highest_peak([{"measured_memory": plan_only}, {"measured_memory": truth}, {}]) == (500, "VmHWM", 900)
    assert highest_peak([{"measured_memory": plan_only}]) == (900, "XLA memory_analysis", 900)  # the plan itself
    assert highest_peak([{}, {"measured_memory": {"peak": None}}]) is None
    estimate = estimate_run_memory(dict(framework="jax", strategy="fsdp-full", num_ranks=2, precision="float32",
                                        optimizer="adamw", global_batch=8, communication_size=2**20,
                                        model=dict(vocab_size=64, seq_len=32, dim=64, num_layers=2, num_heads=4,
                                                   mlp_dim=128)))
    total = estimate.total_bytes
    assert judge_peak(estimate, total, "VmHWM", total) == (total, True, "")
    predicted, within, cause = judge_peak(estimate, 2 * total, "VmHWM", total)
    assert (predicted, within) == (total, False) and "against XLA's plan" in cause
    assert judge_peak(estimate, 2 * total, "XLA memory_analysis", None) == (in_plan_bytes(estimate), None, "")
    assert in_plan_bytes(estimate) == total - estimate["collective_scratch"] < total

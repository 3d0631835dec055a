"""MLX's fully_shard beside the steps it replaced (issue 28): workbench.studies.fully_shard, in one process, on the
committed memory runs the deck reads (notebooks/reference_runs/memory: the same LM and N = 2 under every strategy)."""

import dataclasses

import pandas as pd
import pytest

from workbench.runs.estimate import estimate_run_activation_bytes, estimate_run_memory, run_model_spec
from workbench.runs.spec import VALIDATION_MODEL, RunSpec
from workbench.runs.tables import LoadResult, load_runs
from workbench.strategies import get_strategy
from workbench.studies import fully_shard as study
from workbench.studies.accumulation import accumulation_specs, expected_collectives, step_shape
from workbench.studies.design_review import REFERENCE_STORES, reference_runs_dir
from workbench.studies.memory import PEAK_TOLERANCE

SPEC = dict(REFERENCE_STORES["memory"][1], framework="mlx")


@pytest.fixture(scope="module")
def memory_runs():
    return load_runs(reference_runs_dir("memory"))


@pytest.fixture(scope="module")
def table(memory_runs):
    return study.fully_shard_comparison(memory_runs).set_index("label")


def test_the_four_stand_side_by_side_measured_where_a_run_can_choose_them(table):
    assert list(table.index) == [label for label, _, _ in study.SIDE_BY_SIDE]
    assert list(table.strategy) == ["mlx-fully-shard", "fsdp-row", "fsdp-full", "fsdp-full"]
    assert list(table.reshard_after_forward) == [False, True, True, False]
    measured, modelled = table[table.measured], table[~table.measured]
    assert list(modelled.index) == ["ZeRO-3 (workbench), kept to backward"]
    # every run: its ranks counted what the record says, and its peak meets the memory model's target
    assert (measured.collectives == measured.expected_collectives).all(), measured
    assert ((measured.peak_ratio - 1).abs() <= PEAK_TOLERANCE).all(), measured.peak_ratio
    assert (measured.step_ms > 0).all() and measured.run_id.notna().all()
    assert modelled.peak_mib.isna().all() and modelled.step_ms.isna().all() and modelled.collectives.isna().all()


def test_kept_to_backward_issues_what_fully_shard_issues_and_holds_more_than_resharding(table):
    fully, row = table.loc["MLX fully_shard"], table.loc["fsdp_apply_gradients (workbench, row)"]
    resharded, kept = table.loc["ZeRO-3 (workbench), reshard after forward"], table.loc["ZeRO-3 (workbench), kept to backward"]
    kinds = ["all_gather", "reduce_scatter", "all_reduce"]
    # the same units (each block, then the root), none gathered again: fully_shard's collectives and bytes
    assert list(kept[kinds]) == list(fully[kinds]) and kept.mib_sent == fully.mib_sent
    blocks = VALIDATION_MODEL["num_layers"]
    assert resharded.all_gather == kept.all_gather + blocks and resharded.mib_sent > kept.mib_sent
    assert kept.model_peak_mib > resharded.model_peak_mib  # every unit gathered until its backward
    # fully_shard: as kept, plus the supplied ring reduce-scatter's buffers of the largest unit
    assert fully.model_peak_mib > kept.model_peak_mib
    assert row.all_gather == row.reduce_scatter > fully.reduce_scatter  # a bucket of 1 MiB, not a unit, per sync


def test_an_estimate_with_the_records_own_resharding_is_the_runs():
    for strategy, kw in (("fsdp-full", {}), ("mlx-fully-shard", {}), ("fsdp-row", {}),
                         ("fsdp-full", dict(num_microbatches=4, defer_sync=False))):
        spec = RunSpec(**{**SPEC, "strategy": strategy, **kw})
        assert study.estimate_comparison_memory(spec) == estimate_run_memory(spec)
        assert study.estimate_comparison_memory(spec, get_strategy(strategy).reshard_after_forward) == \
            estimate_run_memory(spec)
        assert study.comparison_step_shape(spec).units == step_shape(spec).units


def test_zero3_kept_to_backward_changes_only_the_gathered_units_and_the_recomputed_activations():
    spec = RunSpec(**{**SPEC, "strategy": "fsdp-full"})
    resharded, kept = estimate_run_memory(spec), study.estimate_comparison_memory(spec, False)
    changed = {c.name for c, d in zip(resharded.components, kept.components) if c != d}
    assert changed == {"gathered_unit", "activations"}
    config, micro = spec.config, spec.micro_batch_size
    assert kept["activations"] == estimate_run_activation_bytes(config, micro, "float32", recompute=False)
    assert resharded["activations"] == estimate_run_activation_bytes(config, micro, "float32", recompute=True)
    params = sum(p.size for p in run_model_spec(spec)) * 4
    assert params < kept["gathered_unit"] < 2 * params  # every parameter gathered + the largest unit's gradient
    shape = study.comparison_step_shape(spec, False)
    assert not any(again for _, again in shape.units)
    assert get_strategy("fsdp-full").collective_counts(shape) == expected_collectives(
        RunSpec(**{**SPEC, "strategy": "mlx-fully-shard"}))


def test_a_resharding_a_record_cannot_choose_is_refused_naming_the_strategy():
    with pytest.raises(ValueError, match="'mlx-fully-shard' .*no reshard_after_forward to choose"):
        study.estimate_comparison_memory(RunSpec(**{**SPEC, "strategy": "mlx-fully-shard"}), True)
    with pytest.raises(ValueError, match="'fsdp-row' .*no reshard_after_forward to choose"):
        study.comparison_step_shape(RunSpec(**{**SPEC, "strategy": "fsdp-row"}), False)


def test_runs_of_another_spec_another_g_or_none_are_refused_naming_what_differs(memory_runs):
    runs = memory_runs.runs
    other = runs.copy()
    other.loc[other["spec.strategy"] == "fsdp-full", "spec.learning_rate"] = 1e-3
    with pytest.raises(ValueError, match=r"differ in learning_rate \((0.003 vs 0.001|0.001 vs 0.003)\)"):
        study.fully_shard_comparison(dataclasses.replace(memory_runs, runs=other))
    twice = runs[runs["spec.strategy"] == "fsdp-row"]
    with pytest.raises(ValueError, match="two done runs of 'fsdp-row'"):
        study.fully_shard_comparison(LoadResult(runs=pd.concat([twice, twice]), steps=memory_runs.steps, problems=[]))
    with pytest.raises(ValueError, match="no done MLX run of .* at num_microbatches=4"):
        study.fully_shard_comparison(memory_runs, num_microbatches=4)
    # one strategy's run alone: the others get the models' figures only
    alone = study.fully_shard_comparison(dataclasses.replace(memory_runs, runs=twice))
    assert list(alone.measured) == [False, True, False, False] and alone.model_peak_mib.notna().all()


def test_the_slide_shows_worded_headers_and_rounded_numbers(table):
    shown = study.comparison_display(table.reset_index())
    assert list(shown.columns) == list(study.DISPLAY_HEADERS.values())
    assert list(shown.index) == [label for label, _, _ in study.SIDE_BY_SIDE]
    assert list(shown["peak MiB per rank, model"]) == [f"{v:.1f}" for v in table.model_peak_mib]
    assert list(shown["collectives per step, model"]) == [str(int(v)) for v in table.expected_collectives]
    kept = shown.loc["ZeRO-3 (workbench), kept to backward"]  # the models' figures only
    assert [kept[h] == study.NOT_RUN for h in shown.columns] == [True, False, True, True, True, False, False]


def test_the_accumulation_sweep_runs_only_what_each_record_can():
    base = dict(num_ranks=2, steps=3, global_batch=16, model=VALIDATION_MODEL)
    specs = study.runnable_accumulation_specs(base, frameworks=["mlx", "jax"],
                                              strategies=["fsdp-row", "mlx-fully-shard"], microbatches=[1, 4])
    got = [(s.framework, s.strategy, s.num_microbatches, s.defer_sync) for s in specs]
    assert got == [("mlx", "fsdp-row", 1, True), ("mlx", "fsdp-row", 4, True), ("mlx", "fsdp-row", 4, False),
                   ("mlx", "mlx-fully-shard", 1, True), ("mlx", "mlx-fully-shard", 4, False),
                   ("jax", "fsdp-row", 1, True), ("jax", "fsdp-row", 4, True), ("jax", "fsdp-row", 4, False)]
    assert specs[:3] == accumulation_specs(base, frameworks=["mlx"], strategies=["fsdp-row"], microbatches=[1, 4])

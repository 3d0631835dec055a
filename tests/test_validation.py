"""The memory model against real runs: every run stores its measurement beside its estimate."""

import pytest

from workbench.estimate.breakdown import PHASES
from workbench.runs.estimate import estimate_run_memory, spec_from_row
from workbench.ranks.probes import TRUTH_SOURCE
from workbench.runs.spec import VALIDATION_MODEL, RunSpec
from workbench.runs.tables import load_runs
from workbench.studies.memory import (COMPONENT_TOLERANCE, PEAK_TOLERANCE, in_plan_bytes, memory_validation,
                                      memory_validation_summary)

from held_peaks import beyond_the_plan


STRATEGIES = ("ddp", "fsdp-row", "fsdp-flat", "fsdp-full")


def spec(framework, strategy, **kw):
    return RunSpec(**{"framework": framework, "strategy": strategy, "num_ranks": 2, "steps": 3, "global_batch": 8,
                      "model": VALIDATION_MODEL, "communication_size": 2**20, **kw})


@pytest.fixture(scope="module")
def validated(tmp_path_factory, shared_runs, engine_pool):
    root = tmp_path_factory.mktemp("runs")
    runs = [(framework, strategy) for framework in ("mlx", "jax") for strategy in STRATEGIES]
    outcomes = {r: shared_runs.run(spec(*r), root, pool=engine_pool) for r in runs}  # trained once a session, whoever asks first
    assert {o.status for o in outcomes.values()} == {"done"}, {r: o.error for r, o in outcomes.items()}
    loaded = load_runs(root)
    return loaded, memory_validation(loaded)


def test_every_run_record_holds_its_estimate(validated):
    loaded, _ = validated
    for _, run in loaded.runs.iterrows():
        stored = {c: run[f"memory_estimate.{c}"] for c in PHASES["states"]}
        assert stored == {c: estimate_run_memory(spec_from_row(run))[c] for c in stored}


def test_parameters_and_optimizer_state_within_5_percent_on_every_rank(validated):
    _, table = validated
    states = table[table.component != "peak"]
    assert len(states) == 8 * 2 * 2  # runs x ranks x components
    assert states.within.all(), states[~states.within.astype(bool)]
    assert ((states.ratio - 1).abs() <= COMPONENT_TOLERANCE).all()


def test_mlx_peak_within_10_percent_and_fsdp_below_ddp(validated):
    _, table = validated
    peaks = table[(table.component == "peak") & (table.framework == "mlx")]
    assert set(peaks.strategy) == set(STRATEGIES) and len(peaks) == 8
    assert ((peaks.ratio - 1).abs() <= PEAK_TOLERANCE).all(), peaks
    measured = peaks.groupby("strategy").measured_bytes.max()
    # FSDP shards the AdamW state and holds one new tree, not DDP's averaged gradients too; ZeRO-3 its parameters
    assert all(measured[s] < 0.8 * measured["ddp"] for s in STRATEGIES[1:]), measured


def test_jax_peak_is_the_ranks_truth_held_to_10_percent_under_every_strategy(validated):
    """Each JAX rank's truth (VmHWM), held to 10% of the run's estimate under all four strategies (issue 26). A
    missed peak's term is named by peak_cause (tests/test_memory_view.py holds how). One miss is let by, as
    held_peaks lets it by: the ranks of one run over the prediction where XLA's plan of the step holds. ZeRO-3's
    rank 1 holds memory beside the compiled step that its rank 0 does not, from run to run: on this LM, 11 runs of
    fsdp-full on kept engines read 0.93 of the estimate on rank 0 and 0.93-1.08 on rank 1 (10 and 10-22 MB above
    XLA's plan), and CI's at 9841ff7 1.135 (27 MB). Since the ranks meet before the measured step (train_jax's
    barrier), rank 1 read 0.93-0.95 in 16 runs alone and 0.98-1.05 in three runs of the test suites."""
    loaded, table = validated
    peaks = table[(table.component == "peak") & (table.framework == "jax")]
    assert len(peaks) == 8 and set(peaks.strategy) == set(STRATEGIES)
    assert (peaks.tolerance == PEAK_TOLERANCE).all() and (peaks.source == TRUTH_SOURCE).all()
    jax_runs = loaded.runs[loaded.runs["spec.framework"] == "jax"]
    stored = {(run_id, r["rank"]): r["measured_memory"]
              for run_id, ranks in zip(jax_runs.run_id, jax_runs["summary.ranks"]) for r in ranks}
    print(peaks[["strategy", "rank", "predicted_bytes", "measured_bytes", "plan_bytes", "ratio", "cause"]].to_string())
    in_plan = {run_id: in_plan_bytes(estimate_run_memory(spec_from_row(run)))
               for run_id, (_, run) in zip(jax_runs.run_id, jax_runs.iterrows())}
    let_by = set()
    for row in peaks.itertuples():
        measured = stored[row.run_id, row.rank]
        assert (row.measured_bytes, row.plan_bytes) == (measured["truth_peak"], measured["peak"])
        assert bool(row.within) == (abs(row.ratio - 1) <= PEAK_TOLERANCE) and (row.cause == "") == bool(row.within)
        if not row.within:  # named, and the one miss let by: over the prediction, beside a plan that holds
            assert beyond_the_plan(row.ratio, row.plan_bytes / in_plan[row.run_id]), row
            let_by.add(row.run_id)
    assert len(let_by) <= 1, let_by
    summary = memory_validation_summary(table)
    missed = summary[summary.within == False]  # noqa: E712 (None: a row without a target)
    let_by_strategies = set(peaks.strategy[peaks.run_id.isin(let_by)])
    assert set(zip(missed.framework, missed.strategy, missed.component)) <= {
        ("jax", s, "peak") for s in let_by_strategies}, summary
    assert (missed.cause != "").all(), summary
    # ZeRO-3 holds half the parameters per rank at rest
    full = table[(table.strategy == "fsdp-full") & (table.component == "parameters")]
    assert (full.measured_bytes * 2 == estimate_run_memory(spec("jax", "ddp"))["parameters"]).all()


def test_a_jax_runs_measured_peak_is_near_xlas_plan_of_its_step(validated):
    loaded, _ = validated
    jax_runs = loaded.runs[loaded.runs["spec.framework"] == "jax"]
    runs = {strategy: [r["measured_memory"] for r in ranks]
            for strategy, ranks in zip(jax_runs["spec.strategy"], jax_runs["summary.ranks"])}
    assert len(runs) == 4 and all(m["truth_source"] == TRUTH_SOURCE for ms in runs.values() for m in ms)
    # A run's peak is its highest rank's, read over one more step after the run's with each buffer in pages of its
    # own: near the plan on this LM (issue 26), and alike on the two ranks of a symmetric step. Read over a timed
    # step with glibc's heap, one rank or both read 0.55-0.70 of the plan from the third step on (the step's
    # temporaries reused pages the heap kept). ddp's ranks read 0.94-1.01 of the plan, up to 8% apart. The
    # collectives' own buffers (gloo's) are outside XLA's plan: fsdp-full's rank 1 read 1.35-1.46 of it quiet (its
    # rank 0 1.01); on a 33.7M-parameter LM its truth was 64-96 MiB over the plan.
    ddp = [m["truth_peak"] for m in runs["ddp"]]
    assert max(ddp) <= 1.15 * min(ddp), ddp  # a rank reading 0.55-0.70 of the other fails it
    ratios = {strategy: round(max(m["truth_peak"] for m in ms) / max(m["peak"] for m in ms), 3) for strategy, ms in runs.items()}
    assert 0.85 < ratios["ddp"] < 1.15 and 0.95 < ratios["fsdp-full"] < 1.6, ratios
    assert all(0.9 < ratios[s] < 1.15 for s in ("fsdp-row", "fsdp-flat")), ratios  # a reduce-scatter: gloo's buffers


def test_estimate_follows_the_framework_and_strategy():
    mlx_ddp, mlx_fsdp = estimate_run_memory(spec("mlx", "ddp")), estimate_run_memory(spec("mlx", "fsdp-row"))
    p = mlx_ddp["parameters"]
    assert mlx_ddp["optimizer_state"] == 2 * p and mlx_fsdp["optimizer_state"] == p  # AdamW, fp32, 2 ranks
    assert mlx_ddp["reduced_gradients"] == p and mlx_fsdp["reduced_gradients"] == 0
    assert mlx_fsdp["updated_optimizer_state"] == 0
    assert estimate_run_memory(spec("jax", "fsdp-row"))["updated_optimizer_state"] == 0  # donated (issue 30)
    assert estimate_run_memory(spec("jax", "ddp"))["updated_optimizer_state"] == 2 * p
    assert mlx_fsdp["master_weights"] == p // 2  # the resident step's master shard, 1/N of the parameters
    bf16 = estimate_run_memory(spec("mlx", "ddp", precision="bfloat16"))
    assert bf16["parameters"] * 2 == p and bf16["optimizer_state"] * 2 == 2 * p
    assert estimate_run_memory(spec("mlx", "ddp", optimizer="sgd"))["optimizer_state"] == 0
    with pytest.raises(ValueError, match="strategy"):
        estimate_run_memory({**spec("mlx", "ddp").to_dict(), "strategy": "zero4"})

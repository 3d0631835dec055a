"""The notebooks' closing checks (workbench.studies.checks) on the committed reference runs: true where the
runs hold, and false, naming the claim, where one does not."""

import pytest

from workbench.models.data import entropy_rate_nats, make_markov_chain
from workbench.runs.tables import load_runs
from workbench.studies.advice import advice_against_sweep
from workbench.studies.checks import collectives_per_bucket, comm_size_checks, convergence_checks
from workbench.studies.design_review import REFERENCE_SWEEP, reference_runs_dir
from workbench.studies.memory import PEAK_TOLERANCE
from workbench.studies.runs import summarize_runs
from workbench.studies.step_time import comm_size_table, fit_links, load_collective_benchmarks


@pytest.fixture(scope="module")
def convergence():
    loaded = load_runs(reference_runs_dir("convergence"))
    spec = loaded.runs.iloc[0]
    vocab = int(spec["spec.model.vocab_size"])
    chain = make_markov_chain(vocab, seed=int(spec["spec.data_seed"]), concentration=float(spec["spec.concentration"]))
    return summarize_runs(loaded), entropy_rate_nats(chain), vocab


def test_the_convergence_checks_hold_on_the_committed_runs_and_name_a_run_that_drifts(convergence):
    summary, floor, vocab = convergence
    assert all(convergence_checks(summary, len(summary), floor, vocab).values())
    drifted = summary.assign(max_abs_loss_diff_to_ddp=summary.max_abs_loss_diff_to_ddp.where(summary.index != 1, 1e-3))
    failed = [k for k, ok in convergence_checks(drifted, len(summary), floor, vocab).items() if not ok]
    assert failed == ["FSDP (row, flat, full) within 1e-5 of DDP at every step"]
    assert not convergence_checks(summary, len(summary) + 1, floor, vocab)["every run stored and done"]


def test_the_bucket_size_checks_hold_on_the_committed_sweep():
    links = fit_links(load_collective_benchmarks(reference_runs_dir("collectives")))
    loaded = load_runs(reference_runs_dir("comm-size"))
    table = comm_size_table(loaded, links)
    advice = advice_against_sweep(loaded, links, strategy=REFERENCE_SWEEP["spec"]["strategy"])
    checks = comm_size_checks(table, all_runs_done=True, num_specs=len(table), links=links, frameworks=("mlx",),
                              advised_size=advice.advice.communication_size, sizes=REFERENCE_SWEEP["sizes"],
                              peak_tolerance=PEAK_TOLERANCE)
    assert [k for k, ok in checks.items() if not ok] == []
    assert (collectives_per_bucket("ddp"), collectives_per_bucket("fsdp-row")) == (1, 2)  # the records say so
    wrong = table.assign(num_collectives=table.num_buckets)  # one per bucket: right for DDP only
    assert not comm_size_checks(wrong, all_runs_done=True, num_specs=len(table), links=links, frameworks=("mlx",),
                                advised_size=advice.advice.communication_size, sizes=REFERENCE_SWEEP["sizes"],
                                peak_tolerance=PEAK_TOLERANCE)["FSDP makes two collectives per bucket, DDP one"]
    unmeasured = comm_size_checks(table, all_runs_done=True, num_specs=len(table), links=links, frameworks=("mlx", "jax"),
                                  advised_size=advice.advice.communication_size, sizes=REFERENCE_SWEEP["sizes"],
                                  peak_tolerance=PEAK_TOLERANCE)  # the committed benchmark is MLX's only
    assert [k for k, ok in unmeasured.items() if not ok] == ["every collective and framework fitted with a positive bandwidth"]

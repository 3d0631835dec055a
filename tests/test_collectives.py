"""The collective benchmark on real engines, the alpha-beta fit, and the step-time tables from real runs."""

import numpy as np
import pandas as pd
import pytest

from workbench.core.buckets import plan_buckets
from workbench.core.units import MiB
from workbench.estimate.advisor import fit_bucket_costs, recommend_communication_size
from workbench.estimate.comm import AlphaBeta, bus_factor, estimate_comm, fit_alpha_beta
from workbench.launch.benchmark import KINDS, SMALL_SIZES, benchmark_spec, run_collective_benchmark
from workbench.launch.driver import run_training
from workbench.runs.estimate import estimate_run_memory, run_model_spec
from workbench.runs.spec import RunSpec
from workbench.runs.store import RunStore
from workbench.runs.tables import load_runs
from workbench.studies.advice import (
    ADVICE_COLUMNS,
    advice_against_sweep,
    fig_bucket_advice,
)
from workbench.studies.runs import WARMUP_STEPS
from workbench.studies.step_time import (
    comm_size_table,
    fig_collective_bandwidth,
    fig_comm_size_sweep,
    fit_links,
    load_collective_benchmarks,
    lower_envelope,
    pr_step_table,
    predict_sync_s,
)

SIZES = SMALL_SIZES  # up to 64 MiB: bandwidth dominates the largest even on a loaded CI machine; notebook 05's sizes
TINY = dict(vocab_size=64, seq_len=16, dim=64, num_layers=2, num_heads=2, mlp_dim=128)


@pytest.fixture(scope="module")
def bench(tmp_path_factory, shared_runs):
    root = tmp_path_factory.mktemp("collectives")
    ids = {fw: run_collective_benchmark(root, fw, 2, sizes_bytes=SIZES) for fw in ("mlx", "jax")}
    for run_id in ids.values():
        shared_runs.offer(root / run_id)  # notebook 05 (nbval, after the tests) runs these two benchmarks
    return root, ids


def test_benchmark_is_stored_and_tabulated_in_nccl_tests_terms(bench):
    root, ids = bench
    table = load_collective_benchmarks(root)
    assert len(table) == 2 * len(KINDS) * len(SIZES)
    assert set(table.run_id) == set(ids.values())
    assert (table.time_s > 0).all()
    np.testing.assert_allclose(table.algbw_bytes_per_s, table.size_bytes / table.time_s)
    ranks = {run_id: RunStore(root).load_record(run_id)["summary"]["ranks"] for run_id in ids.values()}
    for row in table.itertuples():  # each call's mean beside its median: the slowest rank's of each
        key = f"{row.kind}:{row.size_bytes}"
        assert row.mean_s == pytest.approx(max(np.mean(r["times_s"][key]) for r in ranks[row.run_id]))
        assert row.time_s == pytest.approx(max(np.median(r["times_s"][key]) for r in ranks[row.run_id]))
    for kind, factor in (("all_reduce", 1.0), ("all_gather", 0.5), ("reduce_scatter", 0.5)):  # 2 ranks
        rows = table[table.kind == kind]
        np.testing.assert_allclose(rows.busbw_bytes_per_s, rows.algbw_bytes_per_s * factor)
        assert (rows.rank_bytes == rows.size_bytes * bus_factor(kind, 2)).all()
    # MLX's CPU ring has no sum_scatter: the benchmark measured the workbench ring, as FSDP uses it
    assert set(table[(table.framework == "mlx") & (table.kind == "reduce_scatter")].path) == {"ring"}
    record = RunStore(root).load_record(ids["mlx"])
    assert record["status"] == "done" and "mlx" in record["summary"]["ranks"][0]["versions"]
    # stored and done: a second call skips (returns at once, same id)
    assert run_collective_benchmark(root, "mlx", 2, sizes_bytes=SIZES) == ids["mlx"]
    fits = fit_links(table)
    assert set(fits) == {(fw, k) for fw in ("mlx", "jax") for k in KINDS}
    fig = fig_collective_bandwidth(table, fits)
    assert len(fig.data) == 2 * 2 * len(KINDS)


def test_fit_recovers_known_constants():
    link = AlphaBeta(20e-6, 5e9)
    sizes = np.array([2.0**k for k in range(10, 29)])
    times = link.predict_s(sizes, 3)
    for relative in (False, True):
        fit = fit_alpha_beta(sizes, times, 3, relative=relative)
        assert fit.alpha_s == pytest.approx(20e-6, rel=1e-6) and fit.beta_bytes_per_s == pytest.approx(5e9, rel=1e-6)


@pytest.mark.parametrize("kwargs, field", [
    (dict(framework="torch"), "framework"), (dict(num_ranks=1), "num_ranks"), (dict(kinds=["all_to_all"]), "kinds"),
    (dict(sizes_bytes=[1001]), "sizes_bytes"), (dict(sizes_bytes=[4]), "sizes_bytes"), (dict(iters=0), "iters"),
])
def test_bad_benchmark_knobs_name_the_field(kwargs, field):
    args = dict(framework="mlx", num_ranks=2) | kwargs
    with pytest.raises(ValueError, match=field):
        benchmark_spec(**args)


def test_mlx_benchmark_calls_back_to_back_unless_the_ranks_outnumber_the_cores(monkeypatch):
    """A step issues its buckets back to back; where a host's ranks outnumber its cores, every collective of a step
    waits for ranks put aside, as a call after a barrier does: the benchmark times its calls each way accordingly
    (benchmark_spec's docstring gives the fits against real runs). JAX's timing has no barrier to choose."""
    monkeypatch.setattr("workbench.launch.benchmark.os.cpu_count", lambda: 2)
    assert benchmark_spec("mlx", 2)["barrier"] == "each size"
    assert benchmark_spec("mlx", 4)["barrier"] == "each call"
    assert benchmark_spec("mlx", 4, ranks_per_host=2)["barrier"] == "each size"  # 2 hosts of 2: the busiest counts
    assert benchmark_spec("mlx", 2, ranks_per_host=3)["barrier"] == "each call"
    assert "barrier" not in benchmark_spec("jax", 4)


@pytest.fixture(scope="module")
def sweep_store(tmp_path_factory):
    """A real two-size sweep: DDP and FSDP-row MLX runs of TINY at 4 KiB and 64 KiB buckets."""
    root = tmp_path_factory.mktemp("sweep")
    for cs in (2**12, 2**16):
        for strategy in ("ddp", "fsdp-row"):
            outcome = run_training(RunSpec(framework="mlx", strategy=strategy, num_ranks=2, steps=3, global_batch=4,
                                           model=TINY, communication_size=cs), root)
            assert outcome.status == "done", outcome.error
    return root


def test_sweep_tables_from_real_runs(sweep_store):
    tmp_path = sweep_store
    links = {("mlx", k): AlphaBeta(1e-4, 1e9) for k in KINDS}
    table = comm_size_table(load_runs(tmp_path), links)
    assert len(table) == 4 and (table.step_ms > table.sync_ms).all() and (table.sync_ms > 0).all()
    loaded = load_runs(tmp_path)
    for _, r in table.iterrows():
        spec = RunSpec(framework="mlx", strategy=r.strategy, num_ranks=2, steps=3, global_batch=4, model=TINY,
                       communication_size=int(r.communication_size))
        steps = loaded.steps[loaded.steps.run_id == r.run_id]
        # Each figure is the one the model or the store gives: the estimate of the same spec, the ring's
        # bytes for its bucket plan, the largest peak any rank recorded, the median of steps after warm-up.
        assert r.predicted_peak_mib == estimate_run_memory(spec).total_bytes / MiB
        plan = plan_buckets(run_model_spec(spec.to_dict()), spec.communication_size)
        comm = estimate_comm(plan, r.strategy, 2)
        assert r.rank_mib_sent == comm.rank_bytes / MiB and r.num_collectives == comm.num_collectives
        assert r.peak_mib == steps.peak_array_bytes.max() / MiB
        steady = steps[steps.step >= WARMUP_STEPS].groupby("step").step_time_s.max().median()
        assert r.step_ms == pytest.approx(steady * 1e3)
    row = table[(table.strategy == "fsdp-row") & (table.communication_size == 2**12)].iloc[0]
    buckets = plan_buckets(run_model_spec(dict(model=TINY, precision="float32")), 2**12)
    assert row.num_buckets == buckets.num_buckets and row.num_collectives == 2 * buckets.num_buckets
    expected = predict_sync_s(estimate_comm(buckets, "fsdp", 2), links, "mlx") * 1e3
    assert row.predicted_sync_ms == pytest.approx(expected)
    pr = pr_step_table(table)
    assert list(pr.columns) == ["params", "comm size", "DDP (ms)", "FSDP (ms)", "DDP bf16 (ms)", "FSDP bf16 (ms)"]
    assert len(pr) == 2 and pr["DDP bf16 (ms)"].isna().all() and pr["FSDP (ms)"].notna().all()
    assert len(fig_comm_size_sweep(table).data) == 2 * 5
    with pytest.raises(KeyError, match="jax all_reduce"):
        predict_sync_s(estimate_comm(buckets, "ddp", 2), links, "jax")


def test_the_advisor_is_asked_about_the_sizes_a_sweep_ran_and_set_beside_their_measurement(sweep_store):
    loaded = load_runs(sweep_store)
    links = {("mlx", k): AlphaBeta(1e-4, 1e9) for k in KINDS}
    check = advice_against_sweep(loaded, links)
    t = check.table
    assert list(t.columns) == ADVICE_COLUMNS and list(t["communication size (MiB)"]) == [2**12 / MiB, 2**16 / MiB]
    # The advice is the estimate layer's own answer for the sweep's model, N and layout, with the cost per bucket
    # and the constant fitted to what the links leave of each size's measured step.
    spec = run_model_spec(dict(model=TINY, precision="float32"))
    bare = recommend_communication_size(spec, 2, links, sizes=[2**12, 2**16], layout="row")
    sweep = comm_size_table(loaded, links).query("strategy == 'fsdp-row'")
    fitted = fit_bucket_costs([p.num_buckets for p in bare.curve],
                              [m / 1e3 - p.predicted_sync_s for m, p in zip(sweep.step_ms, bare.curve)])
    assert (check.base_s, check.per_bucket_s) == pytest.approx(fitted)
    own = recommend_communication_size(spec, 2, links, sizes=[2**12, 2**16], layout="row", base_s=fitted[0],
                                       per_bucket_s=fitted[1])
    assert check.advice.communication_size == own.communication_size
    assert list(t["predicted sync (ms)"]) == pytest.approx([p.predicted_sync_s * 1e3 for p in own.curve])
    # Measured figures are the sweep table's; the gap is the advised size's against the best.
    assert list(t["measured step (ms)"]) == pytest.approx(list(sweep.step_ms))
    best = min(sweep.step_ms)
    advised = float(sweep[sweep.communication_size == own.communication_size].step_ms.iloc[0])
    assert check.gap == pytest.approx(advised / best - 1) and check.within_target == (check.gap <= 0.05)
    assert t.advised.sum() == 1 and t["best measured"].sum() == 1
    # The predicted step is the sync (its cost per bucket included) plus one constant.
    offsets = t["predicted step (ms)"] - t["predicted sync (ms)"]
    assert offsets.max() - offsets.min() < 1e-9
    assert check.summary().loc["advised communication_size", "answer"] == f"{own.communication_size / MiB:g} MiB"
    assert len(fig_bucket_advice(check).data) == 4
    with pytest.raises(ValueError, match="fsdp-full"):
        advice_against_sweep(loaded, links, strategy="fsdp-full")
    with pytest.raises(ValueError, match="needs at least 2"):
        advice_against_sweep(loaded, links, precision="bfloat16")


def test_a_benchmark_too_noisy_to_fit_is_measured_again_with_larger_messages(tmp_path):
    """CI once fitted a negative bandwidth to a benchmark of 4 KiB - 1 MiB timed under load (notebook 08's links):
    the links' maker measures again, with messages up to 16x larger, and fits that run alone."""
    import json

    from workbench.launch.remote import Placement
    from workbench.studies.planner.advise import placement_links

    small = (4096, 16384)
    noisy = run_collective_benchmark(tmp_path, "mlx", 2, sizes_bytes=small, iters=3)
    path = tmp_path / noisy / "record.json"
    record = json.loads(path.read_text())
    for rank in record["summary"]["ranks"]:  # the larger message timed faster, as a busy core can make it
        for key in rank["times_s"]:
            rank["times_s"][key] = [1e-3 if key.endswith(":4096") else 1e-4] * len(rank["times_s"][key])
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match="mlx .*: times_s do not grow with sizes_bytes"):
        placement_links(tmp_path, "mlx", 2, Placement(), run_if_missing=False)
    links, source = placement_links(tmp_path, "mlx", 2, Placement(), sizes_bytes=small)
    assert source.startswith("measured now collective benchmark ") and noisy not in source
    again = source.split("benchmark ")[1].split(" ")[0]
    sizes = {int(k.split(":")[1]) for k in load_collective_benchmarks_record(tmp_path, again)}
    assert sizes >= {4096, 16384, 65536, 262144} and all(link.beta_bytes_per_s > 0 for link in links.values())


def load_collective_benchmarks_record(root, run_id) -> list[str]:
    """The ``kind:size`` keys rank 0 of a stored benchmark timed."""
    return list(RunStore(root).load_record(run_id)["summary"]["ranks"][0]["times_s"])


def test_a_sweep_whose_small_sizes_stalled_is_fitted_to_its_lower_envelope():
    """Sizes up to 1 MiB each an 8 ms scheduler stall, larger ones not: the relative fit's bandwidth came out
    negative. Each time is then read as the least of it and every larger size's (more bytes take no less time),
    and that is fitted. Times whose envelope is flat still name the framework and kind."""
    sizes = np.array([2.0**k for k in range(12, 25, 2)])
    true = AlphaBeta(50e-6, 2e9).predict_s(sizes, 1)
    stalled = np.where(sizes <= 2**20, 8e-3, true)
    with pytest.raises(ValueError, match="bandwidth is not positive"):
        fit_alpha_beta(sizes, stalled, 1, relative=True)
    envelope = lower_envelope(stalled)
    np.testing.assert_array_equal(envelope, np.r_[[true[-2]] * 6, true[-1]])
    table = pd.DataFrame(dict(framework="mlx", kind="all_reduce", rank_bytes=sizes, time_s=stalled, num_steps=1))
    fit = fit_links(table.iloc[::-1])[("mlx", "all_reduce")]  # rows in any order
    assert fit == fit_alpha_beta(sizes, envelope, 1, relative=True) and fit.beta_bytes_per_s > 0
    assert (fit.predict_s(sizes, 1) <= stalled * 1.5).all()  # priced from the envelope, not from the stalls
    flat = table.assign(time_s=np.linspace(8e-3, 1e-3, len(sizes)))
    with pytest.raises(ValueError, match="mlx all_reduce: times_s do not grow"):
        fit_links(flat)

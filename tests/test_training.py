"""Training runs on real ipyparallel engines with real MLX collectives, stored as they go."""

import os
import signal
import time

import numpy as np
import pytest

from workbench.runstore import load_runs
from workbench.training import RunSpec, run_training

TINY = dict(vocab_size=32, seq_len=16, dim=32, num_layers=1, num_heads=2, mlp_dim=64)


def spec(**kw):
    return RunSpec(**{"framework": "mlx", "num_ranks": 2, "steps": 5, "global_batch": 8, "model": TINY, **kw})


@pytest.fixture(scope="module")
def mlx_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    outcomes = {s: run_training(spec(strategy=s), root) for s in ("ddp", "fsdp-row", "fsdp-flat")}
    return root, outcomes


def test_strategies_converge_identically_and_are_stored(mlx_runs):
    root, outcomes = mlx_runs
    assert {o.status for o in outcomes.values()} == {"done"}
    loaded = load_runs(root)
    assert loaded.problems == []
    steps = loaded.steps
    curves = {}
    for strategy, outcome in outcomes.items():
        rows = steps[steps.run_id == outcome.run_id]
        assert sorted(zip(rows.step, rows["rank"])) == [(s, r) for s in range(5) for r in range(2)]
        curves[strategy] = rows.groupby("step").loss.mean().to_numpy()  # equal slices: the global mean
    assert curves["ddp"][-1] < curves["ddp"][0]
    for strategy in ("fsdp-row", "fsdp-flat"):
        np.testing.assert_allclose(curves[strategy], curves["ddp"], rtol=1e-5)
    assert (steps.peak_rss_bytes > 2**20).all() and (steps.peak_array_bytes > 0).all()
    assert (steps.peak_array_bytes < steps.peak_rss_bytes).all()  # arrays live inside the process
    records = loaded.runs.set_index("run_id")
    assert (records.loc[outcomes["fsdp-flat"].run_id, "status"]) == "done"


def test_a_done_spec_is_skipped(mlx_runs):
    root, outcomes = mlx_runs
    again = run_training(spec(strategy="ddp"), root)
    assert again.status == "skipped" and again.run_id == outcomes["ddp"].run_id


@pytest.mark.parametrize("kw, field", [
    (dict(global_batch=7), "global_batch"),
    (dict(strategy="zero-4"), "strategy"),
    (dict(strategy="fsdp-row", num_ranks=3, global_batch=9), "strategy"),  # 32*... arrays do not divide 3
    (dict(model={**TINY, "num_heads": 3}), "num_heads"),
    (dict(strategy="fsdp-full"), "strategy"),
    (dict(framework="jax", strategy="fsdp-full", num_ranks=3, global_batch=3), "strategy"),  # rows of 32-wide arrays
    (dict(learning_rate="fast"), "learning_rate"),
    (dict(weight_decay=-5), "weight_decay"),
    (dict(concentration=-1), "concentration"),
    (dict(communication_size="x"), "communication_size"),
    (dict(max_norm=float("nan")), "max_norm"),
    (dict(data_seed=-1), "data_seed"),
])
def test_bad_specs_are_refused_before_any_engine_starts(kw, field):
    with pytest.raises(ValueError, match=field):
        spec(**kw)


def test_a_killed_engine_fails_the_run_naming_the_rank_and_keeps_its_steps(tmp_path):
    def kill_rank_one_after_two_steps(engines):
        def progress(done):
            if done >= 2 and engines.pids.get(1):
                os.kill(engines.pids.pop(1), signal.SIGKILL)
                holder["killed_at"] = time.monotonic()
        holder["progress"] = progress

    holder = {}
    outcome = run_training(spec(strategy="fsdp-flat", steps=400), tmp_path,
                           on_engines=kill_rank_one_after_two_steps, progress=lambda d: holder.get("progress", print)(d))
    assert outcome.status == "failed" and outcome.rank == 1 and "rank 1" in outcome.error
    assert time.monotonic() - holder["killed_at"] < 30  # failed, recorded and engines stopped within 30 s
    loaded = load_runs(tmp_path)
    record = loaded.runs.iloc[0]
    assert record["status"] == "failed" and record["failed_rank"] == 1 and "rank 1" in record["error"]
    assert len(loaded.steps) >= 2 * 2  # the steps stored before the failure are still there


def test_a_hung_collective_becomes_a_failed_run(tmp_path):
    def freeze_rank_one_after_two_steps(engines):
        def progress(done):
            if done >= 2 and 1 in engines.pids and "frozen" not in holder:
                os.kill(engines.pids[1], signal.SIGSTOP)  # rank 0 now waits forever in a collective
                holder["frozen"] = True
                holder["frozen_at"] = time.monotonic()
        holder["progress"] = progress

    holder = {}
    outcome = run_training(spec(strategy="ddp", steps=400), tmp_path, step_timeout_s=3,
                           on_engines=freeze_rank_one_after_two_steps, progress=lambda d: holder.get("progress", print)(d))
    assert outcome.status == "failed" and "no step finished for 3 s" in outcome.error
    assert time.monotonic() - holder["frozen_at"] < 3 + 15  # the timeout, then stopping the engines


def test_the_backends_capabilities_are_recorded_with_the_run(mlx_runs):
    root, outcomes = mlx_runs
    ranks = load_runs(root).runs.set_index("run_id").loc[outcomes["fsdp-flat"].run_id, "summary.ranks"]
    for r in ranks:  # ring: no sum_scatter ("[ring] sum_scatter not supported."), no Group.split
        assert r["backend"] == "ring" and r["capabilities"] == {"sum_scatter": False, "group_split": False}
        assert r["collective_path"] == "ring" and r["ring_transport"] == "all_gather exchange"
        assert r["peak_rss_bytes"] > r["peak_array_bytes"] > 0 and "mlx" in r["versions"]

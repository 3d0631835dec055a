"""Training runs on real ipyparallel engines with real MLX collectives, stored as they go."""

import os
import signal
import time

import numpy as np
import pytest

from workbench.adapters.mlx.blas import expected_blas
from workbench.launch.driver import run_training
from workbench.runs.spec import RunSpec
from workbench.runs.tables import load_runs

TINY = dict(vocab_size=32, seq_len=16, dim=32, num_layers=1, num_heads=2, mlp_dim=64)


def spec(**kw):
    return RunSpec(**{"framework": "mlx", "num_ranks": 2, "steps": 5, "global_batch": 8, "model": TINY, **kw})


@pytest.fixture(scope="module")
def mlx_runs(tmp_path_factory, engine_pool):
    root = tmp_path_factory.mktemp("runs")
    outcomes = {s: run_training(spec(strategy=s), root, pool=engine_pool) for s in ("ddp", "fsdp-row", "fsdp-flat", "fsdp-full")}
    return root, outcomes


ACCUM = {(s, g, d): dict(strategy=s, num_microbatches=g, defer_sync=d)
         for s in ("ddp", "fsdp-row", "fsdp-full") for g, d in ((2, True), (2, False))}


@pytest.fixture(scope="module")
def accum_runs(mlx_runs, engine_pool):
    root, _ = mlx_runs
    return {key: run_training(spec(**kw), root, pool=engine_pool) for key, kw in ACCUM.items()}


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
    for strategy in ("fsdp-row", "fsdp-flat", "fsdp-full"):
        np.testing.assert_allclose(curves[strategy], curves["ddp"], rtol=1e-5)
    assert (steps.peak_rss_bytes > 2**20).all() and (steps.peak_array_bytes > 0).all()
    assert (steps.peak_array_bytes < steps.peak_rss_bytes).all()  # arrays live inside the process
    records = loaded.runs.set_index("run_id")
    assert (records.loc[outcomes["fsdp-flat"].run_id, "status"]) == "done"


def _rank0(root, run_id):
    loaded = load_runs(root)
    steps = loaded.steps[(loaded.steps.run_id == run_id) & (loaded.steps["rank"] == 0)].sort_values("step")
    return steps, loaded.runs.set_index("run_id").loc[run_id, "summary.ranks"][0]


def test_accumulated_steps_equal_one_large_batch_step_and_count_their_collectives(mlx_runs, accum_runs):
    root, outcomes = mlx_runs
    assert {o.status for o in accum_runs.values()} == {"done"}
    ddp, _ = _rank0(root, outcomes["ddp"].run_id)
    counts = {}
    for (strategy, g, defer), outcome in accum_runs.items():
        steps, summary = _rank0(root, outcome.run_id)
        # The same 5 global batches: the step (hence every later loss) equals one large-batch step.
        np.testing.assert_allclose(steps.loss.to_numpy(), ddp.loss.to_numpy(), rtol=2e-5, err_msg=str((strategy, defer)))
        # The norm of the averaged gradient: a mis-scaled accumulation shows here, where AdamW's update hides it.
        np.testing.assert_allclose(steps.grad_norm.to_numpy(), ddp.grad_norm.to_numpy(), rtol=1e-5,
                                   err_msg=str((strategy, defer)))
        assert (steps.num_collectives == sum(summary["collectives"].values())).all()
        counts[strategy, defer] = summary["collectives"]
    _, single = _rank0(root, outcomes["fsdp-row"].run_id)
    one = single["collectives"]  # G=1: one reduce-scatter and one all-gather per bucket, the clip's all-reduce
    assert counts["fsdp-row", True] == one
    assert counts["fsdp-row", False] == {**one, "reduce_scatter": 2 * one["reduce_scatter"]}
    assert counts["ddp", False]["all_reduce"] == 2 * counts["ddp", True]["all_reduce"] > 0
    full_deferred, full_each = counts["fsdp-full", True], counts["fsdp-full", False]
    assert full_each["reduce_scatter"] == 2 * full_deferred["reduce_scatter"] > 0  # every unit, every micro-batch
    assert full_each["all_gather"] > 2 * full_deferred["all_gather"] > 0  # and gathered again in backward


def test_a_done_spec_is_skipped(mlx_runs):
    root, outcomes = mlx_runs
    again = run_training(spec(strategy="ddp"), root)
    assert again.status == "skipped" and again.run_id == outcomes["ddp"].run_id


@pytest.mark.parametrize("kw, field", [
    (dict(global_batch=7), "global_batch"),
    (dict(strategy="zero-4"), "strategy"),
    (dict(strategy="fsdp-row", num_ranks=3, global_batch=9), "strategy"),  # 32*... arrays do not divide 3
    (dict(model={**TINY, "num_heads": 3}), "num_heads"),
    (dict(num_microbatches=3), "num_microbatches"),
    (dict(num_microbatches=0), "num_microbatches"),
    (dict(defer_sync="yes"), "defer_sync"),
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
        assert r["versions"]["mlx-blas"] == expected_blas()  # OpenBLAS here (workbench.adapters.mlx.blas)


def test_the_accumulation_table_matches_the_collective_model_on_every_run(mlx_runs, accum_runs):
    from workbench.studies.accumulation import accumulation_table

    root, _ = mlx_runs
    table = accumulation_table(load_runs(root))
    assert len(table) == 4 + len(ACCUM) and set(table["mode"]) == {"G = 1", "deferred", "every micro-batch"}
    for _, row in table.iterrows():
        assert row.counted == row.expected, (row.strategy, row.G, row["mode"])
    accumulated = table[table.G > 1]
    assert (accumulated.max_loss_diff < 2e-5).all()
    deferred = accumulated[accumulated["mode"] == "deferred"].set_index("strategy")
    every = accumulated[accumulated["mode"] == "every micro-batch"].set_index("strategy")
    assert (every.mib_sent > deferred.mib_sent).all() and (every.collectives > deferred.collectives).all()
    # every MLX peak is the allocator's mark, held to the model: a miss names its phase's rows
    assert (table.peak_source == "mx.get_peak_memory").all() and table.plan_mib.isna().all()
    assert list(table.peak_within) == [abs(r - 1) <= 0.10 for r in table.peak_ratio], table.peak_ratio
    assert all((c == "") == w and (w or "phase (" in c) for c, w in zip(table.peak_cause, table.peak_within))


@pytest.mark.parametrize("framework", ["jax", "mlx"])
def test_a_taken_rendezvous_port_is_retried_on_fresh_ports(tmp_path, monkeypatch, framework):
    """CI once lost a JAX run to "Failed to start RPC server": another process took the coordinator's
    port between the pick and rank 0's bind. Hold rank 0's port here (the JAX coordinator's, or
    the MLX ring's); the run must relaunch on fresh ports and finish."""
    import socket

    import workbench.launch.relaunch as relaunch
    from workbench.launch.plan import free_ports, plan_launch

    plans = []

    def first_on_a_taken_port(num_ranks, **kw):
        taken = [port] + (free_ports(num_ranks - 1) if kw["framework"] == "mlx" else [])
        plan = plan_launch(num_ranks, **kw, ports=None if plans else taken)
        plans.append(plan)
        return plan

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        monkeypatch.setattr(relaunch, "plan_launch", first_on_a_taken_port)
        outcome = run_training(spec(framework=framework, strategy="ddp", steps=2), tmp_path)
    assert outcome.status == "done", outcome.error
    assert len(plans) == 2 and plans[0].ports[0] == port != plans[1].ports[0]
    loaded = load_runs(tmp_path)
    assert sorted(loaded.steps.step.unique()) == [0, 1] and loaded.runs.status.tolist() == ["done"]


def test_a_port_clash_is_told_apart_from_other_failures():
    from workbench.launch.relaunch import is_port_clash

    assert is_port_clash("rank 0 failed (JaxRuntimeError): [0:apply] JaxRuntimeError: UNKNOWN: Failed to start RPC server")
    assert is_port_clash("E1123 add_port.cc:83] Failed to add port to server: No address added out of total 1")
    assert is_port_clash("rank 0 failed (RuntimeError): [0:apply] RuntimeError: [ring] Couldn't bind socket (error: 98)")
    assert not is_port_clash("[ring] Couldn't bind socket (error: 99)")  # no such address: new ports will not help
    assert not is_port_clash("rank 1 failed (ValueError): shapes (4, 3) and (2,) do not match")


def test_ranks_of_two_launches_that_drew_a_port_alike_are_told_apart_and_relaunched(monkeypatch):
    """Two launches drawing one port can cross (a rank connects to whichever launch listens there; gRPC's
    coordinator sets SO_REUSEPORT): before this field their ranks failed on whichever plan field differed first, or
    trained together where nothing did. Every rank of a launch now carries one random value and compares it first."""
    from workbench.core.fingerprint import LAUNCH_ENV, RanksDisagree, check_rows, fingerprint_row
    from workbench.launch.plan import plan_launch
    from workbench.launch.relaunch import is_port_clash
    from workbench.ranks.user_model import agree_on_start, start_fingerprint

    a, b = plan_launch(2, framework="mlx"), plan_launch(2, framework="mlx")
    assert a.rank_env[0][LAUNCH_ENV] == a.rank_env[1][LAUNCH_ENV] != b.rank_env[0][LAUNCH_ENV]
    params = [("w", np.zeros((2, 3), np.float32))]
    fingerprints = []
    for plan in (a, b):  # rank 0 of one launch and rank 1 of the other, the same model and plan
        monkeypatch.setenv(LAUNCH_ENV, plan.rank_env[0][LAUNCH_ENV])
        fingerprints.append(start_fingerprint(RunSpec(), params, 2))
    assert list(fingerprints[0])[0] == "launch" and fingerprints[0]["paths"] == fingerprints[1]["paths"]
    rows = [fingerprint_row(fp, 2) for fp in fingerprints]

    def exchange(fingerprint):
        check_rows(rows, fingerprint, 0)
        return 0.0

    with pytest.raises(RuntimeError) as crossed:
        agree_on_start(exchange, fingerprints[0], RunSpec(), 0)
    assert "ranks [1]" in str(crossed.value) and is_port_clash(f"rank 0 failed (RuntimeError): {crossed.value}")
    with pytest.raises(RanksDisagree) as sizes:  # a launch of another size crossed: still told by its launch
        check_rows([rows[0], fingerprint_row(fingerprints[1], 4)], fingerprints[0], 0)
    assert sizes.value.field == "launch"
    with pytest.raises(RanksDisagree, match="'paths'"):  # a rank of the same launch with another plan: not relaunched
        check_rows([rows[0], fingerprint_row({**fingerprints[0], "paths": ["v"]}, 2)], fingerprints[0], 0)

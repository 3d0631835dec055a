"""JAX training runs on real ipyparallel engines: two processes, gloo over loopback, stored as they go.

Every strategy (DDP, FSDP row and flat, ZeRO-3) trains the same model on the same global
batches from the same init, so each must reproduce DDP's loss curve step for step.
"""

import numpy as np
import pytest

from workbench.ranks.probes import TRUTH_SOURCE
from workbench.runs.spec import RunSpec
from workbench.runs.tables import load_runs

TINY = dict(vocab_size=32, seq_len=16, dim=32, num_layers=1, num_heads=2, mlp_dim=64)
STRATEGIES = ("ddp", "fsdp-row", "fsdp-flat", "fsdp-full")
STEPS, RANKS = 4, 2


def spec(**kw):
    return RunSpec(**{"framework": "jax", "num_ranks": RANKS, "steps": STEPS, "global_batch": 8, "model": TINY, **kw})


@pytest.fixture(scope="module")
def jax_runs(tmp_path_factory, shared_runs, engine_pool):
    root = tmp_path_factory.mktemp("runs")
    outcomes = {s: shared_runs.run(spec(strategy=s), root, pool=engine_pool) for s in STRATEGIES}  # fsdp-row: test_jax_accum's G=1
    return root, outcomes


def test_every_strategy_runs_and_stores_every_rank_step(jax_runs):
    root, outcomes = jax_runs
    assert {s: o.status for s, o in outcomes.items()} == {s: "done" for s in STRATEGIES}, outcomes
    loaded = load_runs(root)
    assert loaded.problems == []
    for outcome in outcomes.values():
        rows = loaded.steps[loaded.steps.run_id == outcome.run_id]
        assert sorted(zip(rows.step, rows["rank"])) == [(s, r) for s in range(STEPS) for r in range(RANKS)]
        assert set(rows.loss_scope) == {"global"}
        assert (rows.grad_norm > 0).all() and (rows.step_time_s > 0).all() and (rows.peak_rss_bytes > 0).all()


def test_strategies_reproduce_ddp_loss_curve(jax_runs):
    root, outcomes = jax_runs
    steps = load_runs(root).steps
    curves = {}
    for strategy, outcome in outcomes.items():
        rows = steps[steps.run_id == outcome.run_id]
        by_step = rows.groupby("step").loss
        np.testing.assert_array_equal(by_step.min(), by_step.max())  # a global loss: the same on every rank
        curves[strategy] = by_step.mean().to_numpy()
    assert curves["ddp"][-1] < curves["ddp"][0]
    for strategy in STRATEGIES[1:]:
        assert curves[strategy][-1] < curves[strategy][0], strategy
        np.testing.assert_allclose(curves[strategy], curves["ddp"], rtol=0, atol=1e-5, err_msg=strategy)


def test_rank_summaries_name_the_collective_path(jax_runs):
    root, outcomes = jax_runs
    runs = load_runs(root).runs.set_index("run_id")
    # FSDP's reduce-scatter on CPU is the all-to-all one (make_fsdp_step's "auto"); ZeRO-3 keeps psum_scatter.
    expected = {"ddp": "psum", "fsdp-row": "all_to_all", "fsdp-flat": "all_to_all", "fsdp-full": "psum_scatter"}
    for strategy, outcome in outcomes.items():
        ranks = runs.loc[outcome.run_id, "summary.ranks"]
        assert [r["rank"] for r in ranks] == list(range(RANKS))
        for r in ranks:
            assert r["backend"] == "gloo" and r["collective_path"] == expected[strategy], (strategy, r)
            assert r["peak_rss_bytes"] > 0 and "jax" in r["versions"]
            m = r["measured_memory"]  # the process's measured peak of a step, beside XLA's plan of it (its ratio to
            assert m["truth_source"] == TRUTH_SOURCE and m["truth_peak"] > 0  # the plan: test_validation's bigger LM)
            if strategy in ("fsdp-row", "fsdp-flat"):  # one reduce-scatter and one all-gather per planned bucket
                assert r["num_collectives"] == 2 * num_buckets(spec(strategy=strategy)), (strategy, r)


def num_buckets(run_spec):
    """Buckets of the core's plan for this run's model, in JAX's flatten order."""
    from workbench import plan_buckets
    from workbench.adapters.jax.base import spec_from_jax
    from workbench.models.init import init_lm_params

    params = init_lm_params(run_spec.config, run_spec.init_seed)
    return plan_buckets(spec_from_jax(params), run_spec.communication_size).num_buckets


def test_the_collective_path_is_read_from_the_lowered_program():
    from workbench.ranks.train_jax import observed_collective_path

    assert observed_collective_path('%1 = "stablehlo.reduce_scatter"(%0)', 2) == "psum_scatter"
    assert observed_collective_path('%1 = "stablehlo.all_to_all"(%0)', 2) == "all_to_all"
    assert observed_collective_path('%1 = "stablehlo.all_reduce"(%0)', 2) == "psum"
    assert observed_collective_path('%1 = "stablehlo.all_reduce"(%0)', 1) == "none"
    assert observed_collective_path("%1 = stablehlo.add %0, %0", 2) == "none"


def test_hsdp_on_four_ranks_reproduces_ddp_and_shards_within_each_replica_group(jax_runs, shared_runs, engine_pool):
    """hsdp-row on 2 replica groups of 2 ranks: DDP's loss curve (2 ranks, the same global batches), each rank's
    optimizer state half the model's (sharded within its group, not over all 4), and the collectives its record
    counts (a reduce-scatter in the group, an all-reduce across the groups and an all-gather, per bucket)."""
    from workbench.runs.estimate import estimate_run_memory, run_step_shape
    from workbench.strategies import get_strategy

    root, outcomes = jax_runs
    hsdp = spec(strategy="hsdp-row", num_ranks=4, num_replicas=2)
    outcome = shared_runs.run(hsdp, root, pool=engine_pool)
    assert outcome.status == "done", outcome
    loaded = load_runs(root)
    steps = loaded.steps
    curve = steps[steps.run_id == outcome.run_id].groupby("step").loss
    np.testing.assert_array_equal(curve.min(), curve.max())
    ddp = steps[steps.run_id == outcomes["ddp"].run_id].groupby("step").loss.mean().to_numpy()
    np.testing.assert_allclose(curve.mean().to_numpy(), ddp, rtol=0, atol=1e-5)
    ranks = loaded.runs.set_index("run_id").loc[outcome.run_id, "summary.ranks"]
    want = estimate_run_memory(hsdp)["optimizer_state"]
    assert want == estimate_run_memory(spec(strategy="fsdp-row"))["optimizer_state"]  # a group of 2's shard
    counted = get_strategy("hsdp-row").collective_counts(run_step_shape(hsdp))
    assert counted["all_reduce"] == counted["reduce_scatter"] == counted["all_gather"] == num_buckets(hsdp)
    for r in ranks:
        assert abs(r["measured_memory"]["optimizer_state"] - want) <= 8, r["measured_memory"]  # optax's step count
        assert r["num_collectives"] == sum(counted.values()), r

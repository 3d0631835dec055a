"""The step-time benchmark's rank programs, MLX and JAX, on real processes at a small size.

The benchmark (``benchmarks/bench_fsdp_step.py``) prints the figures; this checks that the two
workers time the same model and the strategies they claim: same parameter count, every step timed
on every rank, FSDP's optimizer state 1/N of DDP's, and the MLX ranks' plan check once per plan.
"""

import pytest

from workbench.launch.plan import plan_launch
from workbench.launch.local_run import run_worker

ARGS = ["--hidden", "64", "--layers", "2", "--steps", "3", "--batch", "8", "--communication-size", "4096"]


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    out = {}
    for framework, module in (("mlx", "workbench.ranks.mlx_step_timing"), ("jax", "workbench.ranks.jax_step_timing")):
        tmp = tmp_path_factory.mktemp(framework)
        out[framework] = run_worker(plan_launch(2, framework=framework), module, tmp, *ARGS, timeout_s=300)
    return out


def test_both_frameworks_time_the_same_model_and_every_strategy_on_every_rank(workers):
    mlx, jax = workers["mlx"], workers["jax"]
    assert mlx[0]["num_params"] == jax[0]["num_params"] == 2 * (64 * 64 + 64)
    for ranks in (mlx, jax):
        assert [r["rank"] for r in ranks] == [0, 1]
        for r in ranks:
            assert list(r["times_s"]) == ["ddp", "fsdp-row", "fsdp-flat"]
            assert all(len(t) == 3 and min(t) > 0 for t in r["times_s"].values())


def test_fsdp_keeps_half_of_ddps_optimizer_state_per_rank_in_both(workers):
    for ranks in workers.values():
        for r in ranks:
            state, n = r["optimizer_state_bytes"], r["num_params"]
            # AdamW's two fp32 moments: DDP holds them for all parameters, FSDP for this rank's half
            # (this model needs no padding); both add the same few scalars (the step count; MLX: also the rate).
            scalars = state["ddp"] - 2 * 4 * n
            assert 0 < scalars <= 16
            assert state["fsdp-row"] == state["fsdp-flat"] == 2 * 4 * n // 2 + scalars


def test_the_mlx_ranks_check_each_plan_once(workers):
    for r in workers["mlx"]:
        assert sorted(r["rank_check_s"]) == ["fsdp-flat", "fsdp-row"]
        assert all(0 < s < 5 for s in r["rank_check_s"].values())

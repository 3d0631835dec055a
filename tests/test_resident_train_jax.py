"""JAX training runs keep FSDP's parameters resident in the plan's bucket buffers (issue 30).

The runs are test_train_jax's (two real processes, gloo, trained once a session by ``shared_runs``): the
compiled step of an FSDP run reuses every argument's buffer (parameters and optimizer state donated), and
what the rank measures as its parameters is the buckets' buffers, N*c elements each; DDP's step donates nothing.
"""

import pytest

from workbench.runs.spec import RunSpec
from workbench.runs.tables import load_runs
from workbench.strategies import get_strategy

STRATEGIES = ("ddp", "fsdp-row", "fsdp-flat")
TINY = dict(vocab_size=32, seq_len=16, dim=32, num_layers=1, num_heads=2, mlp_dim=64)  # test_train_jax's runs


def spec(**kw):
    return RunSpec(**{"framework": "jax", "num_ranks": 2, "steps": 4, "global_batch": 8, "model": TINY, **kw})


@pytest.fixture(scope="module")
def runs(tmp_path_factory, shared_runs, engine_pool):
    root = tmp_path_factory.mktemp("runs")
    outcomes = {s: shared_runs.run(spec(strategy=s), root, pool=engine_pool) for s in STRATEGIES}
    assert {s: o.status for s, o in outcomes.items()} == dict.fromkeys(STRATEGIES, "done"), outcomes
    table = load_runs(root).runs.set_index("run_id")
    return {s: table.loc[o.run_id, "summary.ranks"] for s, o in outcomes.items()}


def bucket_buffer_bytes(strategy):
    """Bytes of the plan's replicated bucket buffers: N*c fp32 elements per bucket."""
    from workbench import plan_buckets
    from workbench.adapters.jax.base import spec_from_jax
    from workbench.core.shards import plan_shards
    from workbench.models.init import init_lm_params

    s = spec(strategy=strategy)
    plan = plan_shards(plan_buckets(spec_from_jax(init_lm_params(s.config, s.init_seed)), s.communication_size),
                       s.num_ranks, get_strategy(strategy, framework="jax").layout)
    return 4 * s.num_ranks * int(plan.bucket_chunk_elems.sum())


def test_fsdp_runs_step_on_donated_bucket_buffers(runs):
    for strategy in ("fsdp-row", "fsdp-flat"):
        for r in runs[strategy]:
            held = r["measured_memory"]
            assert held["parameters"] == bucket_buffer_bytes(strategy), (strategy, r["rank"])
            # every byte of the resident parameters and optimizer state is reused by the step's outputs
            assert r["compiled_memory"]["alias_size_in_bytes"] == held["parameters"] + held["optimizer_state"], strategy
    assert all(r["compiled_memory"]["alias_size_in_bytes"] == 0 for r in runs["ddp"])

"""A sweep's engines kept between its runs (:class:`workbench.launch.pool.EnginePool`), on real engines: a run on
engines an earlier run used stores what a run on fresh engines stores, a failed run's engines are never handed
on, and nothing the pool started outlives it."""

import json
import os
import signal
import time

import psutil
import pytest

from workbench.launch.driver import run_training
from workbench.launch.pool import EnginePool
from workbench.launch.sweep import run_specs
from workbench.runs.spec import RunSpec

TINY = dict(vocab_size=32, seq_len=8, dim=16, num_layers=1, num_heads=2, mlp_dim=32)
LARGER = dict(vocab_size=256, seq_len=8, dim=64, num_layers=2, num_heads=2, mlp_dim=256)  # ~35x TINY's parameters
LARGEST = dict(vocab_size=1024, seq_len=8, dim=256, num_layers=2, num_heads=2, mlp_dim=1024)  # ~10x LARGER's
HUGE = dict(vocab_size=2048, seq_len=8, dim=512, num_layers=2, num_heads=2, mlp_dim=2048)  # ~4x LARGEST's


def spec(**kw) -> RunSpec:
    return RunSpec(**{"framework": "mlx", "strategy": "ddp", "num_ranks": 2, "steps": 3, "global_batch": 4,
                      "model": TINY, **kw})


def stored(root, run_id) -> tuple[dict, list[int]]:
    """A run's steps by (rank, step) as (loss, grad_norm), and each rank's measured peak (MLX's array peak; JAX's
    truth, one more step's arguments and how far it raised VmHWM)."""
    steps = [json.loads(line) for line in (root / run_id / "steps.jsonl").read_text().splitlines()]
    ranks = json.loads((root / run_id / "record.json").read_text())["summary"]["ranks"]
    memory = [r["measured_memory"] for r in sorted(ranks, key=lambda r: r["rank"])]
    return ({(s["rank"], s["step"]): (s["loss"], s["grad_norm"]) for s in steps},
            [m.get("truth_peak", m["peak"]) for m in memory])


def test_a_sweep_reuses_its_engines_and_each_run_stores_what_fresh_engines_store(tmp_path):
    specs = [spec(strategy="fsdp-row", model=LARGER), spec(strategy="ddp"),
             spec(framework="jax", strategy="ddp", model=HUGE), spec(framework="jax", strategy="ddp", model=LARGEST)]
    pids = []
    with EnginePool() as pool:
        outcomes = run_specs(specs, tmp_path / "pooled", pool=pool, on_engines=lambda e: pids.append(dict(e.pids)))
        assert [o.status for o in outcomes] == ["done"] * 4, [o.error for o in outcomes]
        assert (pool.starts, pool.reuses) == (2, 2)  # each framework's engines once, handed to its second run
        assert pids[0] == pids[1] != pids[2] == pids[3]
        assert outcomes[1].engines_ready_s == 0.0 < outcomes[0].engines_ready_s
        assert outcomes[3].engines_ready_s == 0.0 < outcomes[2].engines_ready_s
    time.sleep(0.5)
    assert not [p for ranks in pids for p in ranks.values() if psutil.pid_exists(p) and
                psutil.Process(p).status() != psutil.STATUS_ZOMBIE], "an engine outlived its pool"
    # each framework's second run, on engines the first used, against the same spec on fresh engines
    for second in (specs[1], specs[3]):
        fresh = run_training(second, tmp_path / "fresh")
        assert fresh.status == "done", fresh.error
        (pooled_steps, pooled_peaks), (fresh_steps, fresh_peaks) = (stored(tmp_path / name, fresh.run_id)
                                                                    for name in ("pooled", "fresh"))
        assert pooled_steps == fresh_steps, second.framework  # every loss and gradient norm, bit for bit
        # The peak, reset before the run (MLX) or read over one more step after it (JAX), is the run's own. Fresh
        # processes' MLX peaks differ by up to ~6% (84-91 KiB over ranks and runs: buffers MLX allocates once), and
        # JAX's resident pages by a few (80-96 KiB on TINY, so JAX's second run is LARGEST), so 10% is the
        # tolerance; the peak the larger first run left on these engines is several times the second run's, and
        # would fail it
        first = outcomes[specs.index(second) - 1]
        _, larger_peaks = stored(tmp_path / "pooled", first.run_id)
        assert min(larger_peaks) > 3 * max(fresh_peaks), (second.framework, larger_peaks, fresh_peaks)
        # a JAX run's peak is its highest rank's (on a 3.4 MB LM its ranks read 3.2-3.7 MB, so LARGEST's here; ddp,
        # as fsdp-full's rank 1 holds gloo's buffers beside XLA's, 51-68 MB on LARGEST, fresh or kept)
        if second.framework == "jax":
            pooled_peaks, fresh_peaks = [max(pooled_peaks)], [max(fresh_peaks)]
        assert all(abs(a - b) <= 0.10 * b for a, b in zip(pooled_peaks, fresh_peaks)), (pooled_peaks, fresh_peaks)


def test_failed_runs_and_dead_engines_are_never_handed_on(tmp_path):
    held = []

    def kill_rank_one(engines):
        os.kill(engines.pids.pop(1), signal.SIGKILL)

    with EnginePool() as pool:
        failed = run_training(spec(steps=50), tmp_path, pool=pool, on_engines=kill_rank_one)
        assert failed.status == "failed" and failed.rank == 1, failed
        after = run_training(spec(strategy="fsdp-row"), tmp_path, pool=pool, on_engines=held.append)
        assert after.status == "done", after.error
        assert (pool.starts, pool.reuses) == (2, 0)  # the failed run's engines were stopped, not kept
        os.kill(held[0].pids[0], signal.SIGKILL)  # an engine dies while it waits for the next run
        time.sleep(0.2)
        again = run_training(spec(strategy="fsdp-flat"), tmp_path, pool=pool)
        assert again.status == "done", again.error
        assert (pool.starts, pool.reuses) == (3, 0)


def test_a_sweep_checks_a_model_factory_once_for_what_the_check_depends_on(tmp_path, monkeypatch):
    """One process, no engine: the pool keeps the driver's check of a factory's model for the runs of its sweep that
    share the factory, framework, seed, precision, model config and import folders, and builds it again for any
    other; a check that raised is not kept."""
    import dataclasses

    built = []

    def build(s):
        built.append(s)
        if s.init_seed == 7:
            raise ValueError("RunSpec.model_factory: the factory raised")
        return ("model", s.model_factory, s.init_seed)

    factory = dict(model_factory="examples.tiny_attention_lm:mlx_factory", model=dict(vocab_size=384, seq_len=128))
    base = spec(**factory)
    pool = EnginePool()
    same = [base, dataclasses.replace(base, strategy="fsdp-row"), dataclasses.replace(base, steps=9, global_batch=8),
            dataclasses.replace(base, communication_size=2**18)]
    assert {pool.user_model(s, build) for s in same} == {("model", base.model_factory, 0)} and len(built) == 1
    others = [dataclasses.replace(base, init_seed=1), dataclasses.replace(base, precision="bfloat16"),
              dataclasses.replace(base, model=dict(vocab_size=512, seq_len=128)),
              dataclasses.replace(base, framework="jax", model_factory="examples.tiny_attention_lm:jax_factory")]
    for s in others:
        pool.user_model(s, build)
    assert len(built) == 5
    monkeypatch.chdir(tmp_path)  # another working folder: another folder to import the factory from
    pool.user_model(base, build)
    assert len(built) == 6
    failing = dataclasses.replace(base, init_seed=7)
    for _ in range(2):
        with pytest.raises(ValueError, match="the factory raised"):
            pool.user_model(failing, build)
    assert len(built) == 8

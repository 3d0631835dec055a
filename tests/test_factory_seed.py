"""Issue 24, items 6 and 12: a user's factory that does not seed, and one that is slow.

Item 6: every global generator a factory may draw from is seeded from ``spec.init_seed`` before it is
called, and the ranks compare a digest of their starting weights before the first step, so a factory
that draws from a generator nobody can seed fails every rank, naming the ranks and the factory (it used
to train each rank from other weights and end "done"). Item 12: a slow factory is named as such, on the
ranks where it was slow, instead of "a hung collective", and ``timeout_s`` bounds the driver's own build.
"""

import textwrap
import time

import numpy as np
import psutil
import pytest

from workbench.core.paths import REPO_ROOT
from workbench.launch.driver import StepWatchdog, describe_phases, run_training
from workbench.launch.engines import EngineFailure
from workbench.ranks.phases import PHASE_MODEL, PHASE_STEP
from workbench.ranks.user_model import call_factory, start_fingerprint
from workbench.runs.spec import RunSpec
from workbench.runs.tables import load_runs

#: Factories that draw their weights from global generators (seedable) or from the OS (not), and slow ones.
MODELS = textwrap.dedent("""
    import os
    import random
    import time

    import numpy as np

    from examples.tiny_mlp_lm import jax_factory, mlx_factory

    def mlx_global():  # no seed argument: MLX's own initialisation (mx.random), numpy's and Python's generators
        import mlx.core as mx
        from mlx.utils import tree_map

        model, loss_fn = mlx_factory(np.random.randint(2**31))
        model.update(tree_map(lambda a: mx.random.normal(a.shape) * random.random(), model.parameters()))
        return model, loss_fn

    def jax_global():  # numpy's global generator, and Python's
        return jax_factory(np.random.randint(2**31) + random.randrange(2**20))

    def mlx_urandom(seed=0):  # ignores its seed: weights from the OS, which nobody can seed
        return mlx_factory(int.from_bytes(os.urandom(4), "little"))

    def jax_urandom(seed=0):
        return jax_factory(int(np.random.default_rng().integers(2**31)))

    def mlx_slow_on_rank_one(seed=0):
        if os.environ.get("WORKBENCH_RANK") == "1":
            time.sleep(120)
        return mlx_factory(seed)

    def mlx_slow_in_the_driver(seed=0):
        if "WORKBENCH_RANK" not in os.environ:
            time.sleep(120)
        return mlx_factory(seed)

    def mlx_leaves_a_process(seed=0):  # a process that holds the check's stdout and stderr, and stays
        import subprocess

        if "WORKBENCH_RANK" not in os.environ:
            with open("left.pid", "w") as f:
                f.write(str(subprocess.Popen(["sleep", "600"]).pid))
        return mlx_factory(seed)
""")


@pytest.fixture
def models(tmp_path, monkeypatch):
    (tmp_path / "seedmodels.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)  # where a notebook's own module is found, by the driver and the engines
    return tmp_path


def spec(framework, factory, **kw):
    return RunSpec(**{"framework": framework, "num_ranks": 2, "steps": 3, "global_batch": 8,
                      "model_factory": f"seedmodels:{factory}", "model": dict(vocab_size=256, seq_len=32),
                      "data": str(REPO_ROOT / "examples" / "data" / "markov_v256.bin"), **kw})


def digest(run_spec):
    """The starting weights' digest as a rank computes it, from a factory called here."""
    model, _ = call_factory(run_spec)
    if run_spec.framework == "mlx":
        from mlx.utils import tree_flatten

        params = tree_flatten(model.parameters())
    else:
        from workbench.ranks.user_model import nnx_flat_params

        params = list(nnx_flat_params(model).items())
    return start_fingerprint(run_spec, params, 2)["initial_weights"]


@pytest.mark.parametrize("framework", ["mlx", "jax"])
def test_a_factory_drawing_from_global_generators_builds_the_same_weights_every_call(models, framework):
    """Seeded before every call, in one process as in every engine; another init_seed, other weights."""
    one = spec(framework, f"{framework}_global")
    assert digest(one) == digest(one)
    assert digest(spec(framework, f"{framework}_global", init_seed=1)) != digest(one)


def test_an_unseeded_mlx_factory_now_trains_every_rank_from_the_same_weights(models, tmp_path):
    """The issue's case: MLX seeds each process differently, so every rank (and the driver) drew its own."""
    run = spec("mlx", "mlx_global")
    outcome = run_training(run, tmp_path / "runs")
    assert outcome.status == "done", outcome
    ranks = load_runs(tmp_path / "runs").runs.iloc[0]["summary.ranks"]
    assert [r["initial_weights_sha256"] for r in ranks] == [digest(run)] * 2


@pytest.mark.parametrize("framework", ["mlx", "jax"])
def test_a_factory_that_draws_from_an_unseedable_generator_fails_every_rank_naming_the_ranks_and_it(models, tmp_path,
                                                                                                   framework):
    outcome = run_training(spec(framework, f"{framework}_urandom"), tmp_path / "runs")
    assert outcome.status == "failed", outcome
    assert (f"ranks [1] start from other weights than rank 0 (this is rank {outcome.rank}): the model factory "
            f"'seedmodels:{framework}_urandom' built different weights on them") in outcome.error
    assert load_runs(tmp_path / "runs").steps.empty  # before the first step


def test_the_startup_timeout_names_a_slow_factory_and_its_ranks_not_a_hung_collective(models, tmp_path):
    """A factory sleeping on rank 1 was reported as "a hung collective? ... MLX #4475", no rank named."""
    t0 = time.monotonic()
    outcome = run_training(spec("mlx", "mlx_slow_on_rank_one"), tmp_path / "runs", startup_timeout_s=8)
    assert outcome.status == "failed" and time.monotonic() - t0 < 90, outcome
    # Rank 0 is past its factory, or under load still starting: either way it is named, rank 1 as slow.
    assert outcome.error.startswith("no step finished within 8 s of the start: ") and \
        outcome.error.endswith("; engines stopped"), outcome.error
    assert "the model factory 'seedmodels:mlx_slow_on_rank_one' did not return within 8 s on ranks [1]" in \
        outcome.error and "ranks [0]" in outcome.error and "hung collective" not in outcome.error


def test_timeout_s_bounds_the_drivers_own_build_of_a_slow_factory(models, tmp_path):
    """``timeout_s=5`` ran a factory that took 30 s in the driver to "done" after 41-45 s. The build runs in
    a subprocess, stopped at the deadline; its seeding leaves this process's generators alone."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    np.random.seed(123)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"run_training\(timeout_s=4\): the model factory "
                                           r"'seedmodels:mlx_slow_in_the_driver' did not return within [34]\.\d s in the "
                                           r"driver's check, before any engine started"):
        run_training(spec("mlx", "mlx_slow_in_the_driver"), tmp_path / "runs", timeout_s=4)
    assert time.monotonic() - t0 < 4 + 10
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before  # its subprocess is gone
    assert not (tmp_path / "runs").exists()
    assert np.array_equal(np.random.random_sample(2), np.random.RandomState(123).random_sample(2))


def test_a_stalled_start_is_told_by_phase_and_a_stalled_step_stays_a_hung_collective(tmp_path):
    """The watchdog's two messages, in one process: what each rank was doing before its first step; and
    after steps began, the hung-collective message for a step that never finishes."""
    told = describe_phases({0: PHASE_STEP, 1: PHASE_MODEL, 3: PHASE_MODEL}, 4, "m:f", 5)  # furthest behind first
    assert told == ("ranks [2] had not begun the run (their engines busy, or still importing); the model factory "
                    "'m:f' did not return within 5 s on ranks [1, 3]; ranks [0] were in their first step (a hung "
                    "collective? MLX ring all_sum is known to deadlock, MLX #4475)")
    steps = tmp_path / "steps.jsonl"
    watchdog = StepWatchdog(steps, 0.2, 0.2, num_ranks=2, describe_start=lambda s: f"told after {s:g} s")
    watchdog()
    time.sleep(0.3)
    with pytest.raises(EngineFailure, match=r"no step finished within 0 s of the start: told after 0.2 s"):
        watchdog()
    steps.write_text("{}\n{}\n")
    watchdog()  # steps arrived
    time.sleep(0.3)
    with pytest.raises(EngineFailure, match=r"no step finished for 0 s after step 0 \(a hung collective\? MLX ring"):
        watchdog()



def test_a_process_the_factory_leaves_running_neither_holds_the_check_nor_outlives_it(models):
    """The driver's check read its subprocess's pipes to the end: a process the factory started and left
    running held them open, and the check waited until ``timeout_s``, then forever after killing."""
    from workbench.launch.driver import build_user_model

    t0 = time.monotonic()
    built = build_user_model(spec("mlx", "mlx_leaves_a_process"), timeout_s=120)
    assert time.monotonic() - t0 < 60 and built.num_params > 0
    left = int((models / "left.pid").read_text())
    deadline = time.monotonic() + 10
    while psutil.pid_exists(left) and psutil.Process(left).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the factory's process outlived the check"
        time.sleep(0.1)

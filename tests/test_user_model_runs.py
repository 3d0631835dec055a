"""A user's model factory and token file in a run: validated up front, trained on real engines under every
strategy in MLX and JAX with FSDP equal to DDP, and its memory estimate set against measurement."""

import shutil
import textwrap

import numpy as np
import pytest

from workbench.core.paths import REPO_ROOT
from workbench.launch.driver import run_training
from workbench.ranks.user_model import check_user_run
from workbench.runs.spec import LATER_DEFAULTS, RunSpec
from workbench.runs.store import run_id_for
from workbench.runs.tables import load_runs
from workbench.studies.memory import memory_validation

DATA = str(REPO_ROOT / "examples" / "data" / "markov_v256.bin")
STRATEGIES = ("ddp", "fsdp-row", "fsdp-flat", "fsdp-full")


def user_spec(framework="mlx", **kw):
    return RunSpec(**{"framework": framework, "num_ranks": 2, "steps": 4, "global_batch": 8,
                      "model_factory": f"examples.tiny_mlp_lm:{framework}_factory",
                      "model": dict(vocab_size=256, seq_len=32), "data": DATA, **kw})


@pytest.fixture(scope="module", params=["mlx", "jax"])
def user_runs(request, tmp_path_factory, engine_pool):
    root = tmp_path_factory.mktemp(f"user-{request.param}")
    outcomes = {s: run_training(user_spec(request.param, strategy=s), root, pool=engine_pool) for s in STRATEGIES}
    return request.param, root, outcomes


def test_a_user_model_trains_under_every_strategy_with_fsdp_equal_to_ddp(user_runs):
    framework, root, outcomes = user_runs
    assert {s: o.status for s, o in outcomes.items()} == dict.fromkeys(STRATEGIES, "done"), outcomes
    steps = load_runs(root).steps
    curves = {s: steps[steps.run_id == o.run_id].groupby("step").loss.mean().to_numpy() for s, o in outcomes.items()}
    assert len(curves["ddp"]) == 4 and np.isfinite(curves["ddp"]).all()
    for strategy in STRATEGIES[1:]:  # the tolerance of tests/test_training.py
        np.testing.assert_allclose(curves[strategy], curves["ddp"], rtol=1e-5, err_msg=f"{framework} {strategy}")


def test_a_user_models_memory_estimate_is_its_own_and_matches_the_live_arrays(user_runs):
    framework, root, outcomes = user_runs
    table = memory_validation(load_runs(root))
    assert set(table.strategy) == set(STRATEGIES) and set(table["rank"]) == {0, 1}
    held = table[table.component != "peak"]
    assert held.within.all(), held[~held.within.astype(bool)]
    params = table[(table.component == "parameters") & (table.strategy == "ddp")]
    assert (params.predicted_bytes == 20_576 * 4).all()  # examples.tiny_mlp_lm's 20,576 fp32 parameters
    full = table[(table.component == "parameters") & (table.strategy == "fsdp-full")]
    assert (full.predicted_bytes == 20_576 * 4 // 2).all()  # ZeRO-3: each rank keeps half
    assert table[table.component == "peak"].tolerance.isna().all()  # activations beyond the logits: not modelled


def test_old_specs_keep_their_run_ids_and_a_changed_model_source_is_a_new_run(tmp_path, monkeypatch):
    plain = RunSpec().to_dict()
    assert not set(LATER_DEFAULTS) & set(plain)
    assert run_id_for(RunSpec(**plain).to_dict()) == run_id_for(plain)
    pkg = tmp_path / "mymodels"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    shutil.copy(REPO_ROOT / "examples" / "tiny_mlp_lm.py", pkg / "lm.py")
    monkeypatch.chdir(tmp_path)  # the working directory is where a notebook's own package is found
    first = RunSpec(model_factory="mymodels.lm:mlx_factory", model=dict(vocab_size=256, seq_len=32))
    assert len(first.to_dict()["model_source_sha256"]) == 64
    (pkg / "lm.py").write_text((pkg / "lm.py").read_text() + "\n# a changed model\n")
    second = RunSpec(model_factory="mymodels.lm:mlx_factory", model=dict(vocab_size=256, seq_len=32))
    assert run_id_for(first.to_dict()) != run_id_for(second.to_dict())
    with pytest.raises(ValueError, match="model_source_sha256.*changed"):
        RunSpec(**first.to_dict())


@pytest.mark.parametrize("kw, match", [
    (dict(model_factory="no_such_pkg.mod:f"), "model_factory.*cannot import 'no_such_pkg.mod'"),
    (dict(model_factory="examples.tiny_mlp_lm:nothing"), "model_factory.*no function 'nothing'"),
    (dict(model_factory="examples.tiny_mlp_lm"), "model_factory.*'package.module:function'"),
    (dict(model=dict(vocab_size=256, seq_len=32, dim=8)), "model=.*exactly vocab_size and seq_len"),
    (dict(data="no/such/file.bin"), "data=.*no such token file"),
    (dict(data_dtype="int8"), "data_dtype"),
    (dict(model=dict(vocab_size=256, seq_len=65_536)), "data=.*fewer than one window"),
    (dict(model_source_sha256="0" * 64), "model_source_sha256.*changed"),
])
def test_bad_user_inputs_are_refused_naming_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        user_spec(**kw)


def test_a_factory_returning_the_wrong_things_or_a_too_small_vocabulary_fails_before_any_engine(tmp_path, monkeypatch):
    (tmp_path / "badmodels").mkdir()
    (tmp_path / "badmodels" / "__init__.py").write_text(textwrap.dedent("""
        from examples.tiny_mlp_lm import mlx_factory
        def only_module(seed=0):
            return mlx_factory(seed)[0]
        def raises():
            raise RuntimeError("no weights here")
    """))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"badmodels:only_module.*returns \(mlx.nn.Module, loss_fn.*a TinyMLPLM"):
        run_training(user_spec(model_factory="badmodels:only_module"), tmp_path / "runs")
    with pytest.raises(ValueError, match="badmodels:raises.*RuntimeError: no weights here"):
        check_user_run(user_spec(model_factory="badmodels:raises"))
    with pytest.raises(ValueError, match=r"data=.*markov_v256.bin.*>= vocab_size 100"):
        run_training(user_spec(model=dict(vocab_size=100, seq_len=32)), tmp_path / "runs")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())

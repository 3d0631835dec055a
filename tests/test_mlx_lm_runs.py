"""A third-party model from a config trains for real: mlx-lm's Llama and Qwen3 classes, built from tiny configs
(tests/data/mlx_lm_tiny_*.json: the published files' fields, small shapes) by tests/data/mlx_lm_tiny.py's
factories, on 2 real MLX ranks under ddp, fsdp-row, fsdp-flat and fsdp-full: FSDP equals DDP, and every rank's
peak is held to 10% of the prediction made from the model's profile (measured once, on one process).

One fixture trains each model under each strategy once (3 steps, 4 sequences per rank); every test reads it."""

import numpy as np
import pytest

from workbench.core.paths import REPO_ROOT
from workbench.launch.driver import run_training
from workbench.launch.profile import profile_model
from workbench.runs.estimate import spec_from_row
from workbench.runs.profile_estimate import estimate_with_profile
from workbench.runs.spec import RunSpec
from workbench.runs.tables import load_runs

DATA = str(REPO_ROOT / "examples" / "data" / "markov_v256.bin")
STRATEGIES = ("ddp", "fsdp-row", "fsdp-flat", "fsdp-full")
#: Model -> sequence length: Qwen3's is 128, so its attention (scores of T x T) is most of its peak.
MODELS = {"llama": 32, "qwen3": 128}


def spec(model, strategy):
    return RunSpec(framework="mlx", strategy=strategy, num_ranks=2, steps=3, global_batch=8, data=DATA,
                   model=dict(vocab_size=256, seq_len=MODELS[model]),
                   model_factory=f"tests.data.mlx_lm_tiny:{model}_factory")


@pytest.fixture(scope="module")
def mlx_lm_runs(tmp_path_factory, engine_pool):
    root = tmp_path_factory.mktemp("mlx-lm")
    outcomes = {(m, s): run_training(spec(m, s), root, pool=engine_pool) for m in MODELS for s in STRATEGIES}
    engine_pool.close()  # no idle engine beside the profiles' timing
    profiles = {m: profile_model(spec(m, "ddp"), root) for m in MODELS}
    return root, outcomes, profiles


def test_mlx_lm_models_train_under_every_strategy_with_fsdp_equal_to_ddp(mlx_lm_runs):
    root, outcomes, _ = mlx_lm_runs
    assert {k: o.status for k, o in outcomes.items()} == dict.fromkeys(outcomes, "done"), outcomes
    steps = load_runs(root).steps
    for model in MODELS:
        curve = {s: steps[steps.run_id == outcomes[model, s].run_id].groupby("step").loss.mean().to_numpy()
                 for s in STRATEGIES}
        assert len(curve["ddp"]) == 3 and np.isfinite(curve["ddp"]).all() and curve["ddp"][-1] < curve["ddp"][0]
        for strategy in STRATEGIES[1:]:  # the tolerance of tests/test_user_model_runs.py
            np.testing.assert_allclose(curve[strategy], curve["ddp"], rtol=1e-5, err_msg=f"{model} {strategy}")


def test_every_ranks_peak_is_its_profiles_prediction_within_ten_percent(mlx_lm_runs):
    root, outcomes, profiles = mlx_lm_runs
    runs = load_runs(root).runs
    rows = []
    for _, run in runs.iterrows():
        fields = spec_from_row(run)
        model = fields["model_factory"].split(":")[1].removesuffix("_factory")
        predicted = estimate_with_profile(fields, profiles[model], run["model_shapes"]).total_bytes
        for rank in run["summary.ranks"]:
            measured = rank["measured_memory"]["peak"]
            rows.append((model, fields["strategy"], rank["rank"], predicted, measured, measured / predicted))
    print("\nmodel  strategy   rank  predicted B  measured B  measured/predicted")
    for row in sorted(rows):
        print("{:6} {:10} {:4} {:12,} {:11,} {:8.3f}".format(*row))
    assert len(rows) == len(MODELS) * len(STRATEGIES) * 2
    missed = [row for row in rows if abs(row[-1] - 1) > 0.10]
    assert not missed, missed

"""Issue 24, items 8-10: no run trains on other data than the driver validated, or on a model whose
vocabulary is not the one declared. Questions one process can answer are answered here in one process;
the engines' own checks run on real 2-rank runs (MLX ring and JAX gloo)."""

import os
import shutil
import textwrap

import numpy as np
import pytest

from workbench.core.paths import REPO_ROOT
from workbench.launch.driver import run_training
from workbench.ranks.user_model import check_user_run, global_batches
from workbench.runs.spec import RunSpec
from workbench.runs.store import RunStore, run_id_for
from workbench.runs.tables import load_runs

DATA = REPO_ROOT / "examples" / "data" / "markov_v256.bin"

#: Factories whose loss is NaN from the first step.
NAN_MODELS = textwrap.dedent("""
    from examples.tiny_mlp_lm import jax_factory, mlx_factory

    def mlx_nan(seed=0):
        model, loss_fn = mlx_factory(seed)
        return model, lambda model, inputs, targets: loss_fn(model, inputs, targets) * float("nan")

    def jax_nan(seed=0):
        model, loss_fn = jax_factory(seed)
        return model, lambda params, batch: loss_fn(params, batch) * float("nan")
""")


@pytest.fixture
def data(tmp_path, monkeypatch):
    """A copy of the example token file, and the test's folder as the working directory (engines too)."""
    shutil.copy(DATA, tmp_path / "tokens.bin")
    (tmp_path / "nanmodels.py").write_text(NAN_MODELS)
    monkeypatch.chdir(tmp_path)
    return tmp_path / "tokens.bin"


def user_spec(framework="mlx", **kw):
    return RunSpec(**{"framework": framework, "num_ranks": 2, "steps": 4, "global_batch": 8,
                      "model_factory": f"examples.tiny_mlp_lm:{framework}_factory",
                      "model": dict(vocab_size=256, seq_len=32), "data": "tokens.bin", **kw})


def test_changed_data_is_a_new_run_and_a_spec_rebuilt_from_its_dict_refuses_it(data, tmp_path):
    """Item 9: the run id covers the data's bytes (a replaced file was "skipped" with the old results);
    runs without a data file keep their ids (no data_sha256 in their dict)."""
    assert "data_sha256" not in RunSpec().to_dict() and "data_sha256" not in RunSpec(steps=3).to_dict()
    first = user_spec()
    assert first.to_dict()["data_sha256"] == first.data_sha256 and len(first.data_sha256) == 64
    store = RunStore(tmp_path / "runs")
    store.create(first.to_dict()).finish({})
    assert store.is_done(first.to_dict()) and run_id_for(user_spec().to_dict()) == run_id_for(first.to_dict())
    tokens = np.fromfile(data, dtype=np.uint16)
    tokens[::-1].tofile(data)  # the same tokens, in another order: the same size, other data
    second = user_spec()
    assert run_id_for(second.to_dict()) != run_id_for(first.to_dict()) and not store.is_done(second.to_dict())
    with pytest.raises(ValueError, match=r"RunSpec.data_sha256: the token file tokens\.bin changed since this spec was "
                                         r"made \(now 131072 bytes"):
        RunSpec(**first.to_dict())  # what every engine does with the driver's spec
    tokens[:9].tofile(data)  # cut to 9 tokens after validation (the case)
    with pytest.raises(ValueError, match=r"data_sha256: the token file tokens\.bin changed .*\(now 18 bytes"):
        RunSpec(**second.to_dict())
    with pytest.raises(ValueError, match=r"data_sha256: the token file tokens\.bin changed .*\(now 18 bytes"):
        run_training(second, tmp_path / "runs")  # the driver checks again before any engine starts
    with pytest.raises(ValueError, match="data_sha256"):
        RunSpec(data_sha256="0" * 64)  # no data, no digest


def test_a_batch_of_a_file_changed_during_the_run_fails_naming_the_file_and_the_step(data):
    """Item 8, in one process: what each rank runs before every step."""
    spec = user_spec()
    batch_for_step = global_batches(spec)
    assert batch_for_step(0).max() < 256
    same = batch_for_step(1)
    os.utime(data, ns=(1, 1))  # touched (or the same bytes copied back): the same data trains on
    assert np.array_equal(batch_for_step(1), same)
    with open(data, "r+b") as f:  # the same size, other bytes, a new modification time
        f.write(b"\x01\x00")
    with pytest.raises(ValueError, match=r"the token file changed during the run, before step 1 \(131072 bytes when "
                                         r"opened, 131072 now, other bytes\)"):
        batch_for_step(1)
    shutil.copy(DATA, data)
    batch_for_step = global_batches(spec)
    before = os.stat(data)
    with open(data, "r+b") as f:  # overwritten in place with 0xFFFF, its modification time put back
        f.write(b"\xff" * before.st_size)
    os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(ValueError, match=r"RunSpec.data='tokens.bin': step 1's batch holds token 65535, outside "
                                         r"model\['vocab_size'\] = 256"):
        batch_for_step(1)
    os.truncate(data, 18)
    with pytest.raises(ValueError, match=r"RunSpec.data='tokens.bin': the token file changed during the run, before "
                                         r"step 2 \(131072 bytes when opened, 18 now"):
        batch_for_step(2)


def test_a_file_rewritten_between_the_check_and_the_read_is_named_as_changed(data, monkeypatch):
    """The race CI met (stop 36): the file passes the check before a step, is overwritten, and the batch read
    holds stray tokens; the rank says the file changed, not only that a token is out of the vocabulary."""
    import workbench.models.tokens as tokens

    sample, state = tokens.sample_batch, {}

    def rewritten_first(*args, **kw):  # the writer lands between the rank's stat and its read, once
        if not state:
            state["at"] = True
            data.write_bytes(b"\xff" * data.stat().st_size)
        return sample(*args, **kw)

    monkeypatch.setattr(tokens, "sample_batch", rewritten_first)
    batch_for_step = global_batches(user_spec())
    with pytest.raises(ValueError, match=r"the token file changed during the run, before step 3 \(131072 bytes when "
                                         r"opened, 131072 now, other bytes\)"):
        batch_for_step(3)
    assert state


def test_a_model_smaller_than_its_declared_vocabulary_is_refused_before_any_engine(data, tmp_path):
    """Item 10: model['vocab_size']=128256 on 256 embedding rows passed every check and crashed an engine."""
    for framework in ("mlx", "jax"):
        spec = user_spec(framework, model=dict(vocab_size=128256, seq_len=32))
        with pytest.raises(ValueError, match=r"RunSpec.model\['vocab_size'\]=128256: the model of examples.tiny_mlp_lm:"
                                             rf"{framework}_factory holds 256 tokens in its token embedding "
                                             r"'embed.weight', fewer than vocab_size"):
            check_user_run(spec)
    with pytest.raises(ValueError, match=r"model\['vocab_size'\]=300: .* holds 256 tokens in its token embedding"):
        run_training(user_spec(model=dict(vocab_size=300, seq_len=32)), tmp_path / "runs")
    assert not (tmp_path / "runs").exists()
    check_user_run(user_spec(model=dict(vocab_size=200, seq_len=32), data=None))  # a larger table is padding: fine


def test_a_file_cut_after_validation_fails_the_run_on_the_engines_naming_the_file(data, tmp_path):
    """Item 8: cut after the driver validated it, still longer than a window (the issue's run memorised the
    tokens left and ended "done")."""
    spec = user_spec()

    def cut(engines):  # after the driver's checks, before the ranks start
        np.fromfile(data, dtype=np.uint16)[:100].tofile(data)

    outcome = run_training(spec, tmp_path / "runs", on_engines=cut)
    assert outcome.status == "failed", outcome
    assert "RunSpec.data_sha256: the token file tokens.bin changed since this spec was made (now 200 bytes" \
        in outcome.error
    assert load_runs(tmp_path / "runs").steps.empty


def test_a_file_overwritten_during_a_run_fails_it_naming_the_file(data, tmp_path):
    """Item 8: overwritten in place with 0xFFFF mid-run (the issue's JAX run trained on NaN and ended "done")."""
    state = {}

    def overwrite(done):
        if done >= 2 and "at" not in state:
            with open(data, "r+b") as f:
                f.write(b"\xff" * os.path.getsize(data))
            state["at"] = done

    outcome = run_training(user_spec(steps=2000), tmp_path / "runs", progress=overwrite)
    assert outcome.status == "failed" and "at" in state, outcome
    assert "RunSpec.data='tokens.bin': the token file changed during the run, before step" in outcome.error
    steps = load_runs(tmp_path / "runs").steps
    assert 2 <= steps.step.max() < 1999 and np.isfinite(steps.loss).all()


@pytest.mark.parametrize("framework", ["mlx", "jax"])
def test_a_non_finite_loss_fails_the_run_naming_the_step_and_the_rank(data, tmp_path, framework):
    """Item 8: a NaN loss no longer ends "done"."""
    outcome = run_training(user_spec(framework, model_factory=f"nanmodels:{framework}_nan"), tmp_path / "runs")
    assert outcome.status == "failed" and outcome.rank in (0, 1), outcome
    assert f"rank {outcome.rank} failed (FloatingPointError)" in outcome.error
    assert f"rank {outcome.rank}: the loss of step 0 is nan, not finite" in outcome.error
    steps = load_runs(tmp_path / "runs").steps
    assert list(steps.step) == [0] * len(steps) and steps.loss.isna().all()  # the step's rows are stored


def test_position_and_segment_tables_are_not_the_token_table():
    """A learned position table (GPT-2's wpe, the built-in LM's pos_embed) holds seq_len rows, not the
    vocabulary: the check was refusing every such model. The largest embedding is the token table."""
    import mlx.nn as nn
    from flax import nnx

    from workbench.adapters.jax.base import spec_from_nnx
    from workbench.adapters.mlx.base import spec_from_mlx
    from workbench.ranks.model_vocab import check_model_vocab

    class Spec:
        model_factory = "models:gpt"

        def __init__(self, vocab_size):
            self.model = {"vocab_size": vocab_size}

    class MLXGPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe, self.segment = nn.Embedding(64, 8), nn.Embedding(16, 8), nn.Embedding(2, 8)
            self.lm_head = nn.Linear(8, 64)

    class NNXGPT(nnx.Module):
        def __init__(self, rngs):
            self.tokens, self.position = nnx.Embed(64, 8, rngs=rngs), nnx.Embed(16, 8, rngs=rngs)

    for model, spec_of in ((MLXGPT(), spec_from_mlx), (NNXGPT(nnx.Rngs(0)), spec_from_nnx)):
        params = [(p.path, p.shape) for p in spec_of(model).params]
        check_model_vocab(Spec(64), model, params)
        with pytest.raises(ValueError, match=r"=65: the model of models:gpt holds 64 tokens in its token embedding "
                                             r"'(wte.weight|tokens.embedding)'"):
            check_model_vocab(Spec(65), model, params)


def test_a_spec_copied_onto_other_data_says_to_drop_the_old_digest(data, tmp_path):
    """dataclasses.replace carries data_sha256 over: the refusal names the remedy, which works."""
    import dataclasses

    other = tmp_path / "other.bin"
    other.write_bytes(data.read_bytes()[::-1])
    spec = user_spec()
    with pytest.raises(ValueError, match=r"dataclasses.replace with other data keeps the old digest: pass "
                                         r"data_sha256=None too"):
        dataclasses.replace(spec, data=str(other))
    moved = dataclasses.replace(spec, data=str(other), data_sha256=None)
    assert moved.data_sha256 != spec.data_sha256 and run_id_for(moved.to_dict()) != run_id_for(spec.to_dict())

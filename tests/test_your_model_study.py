"""Notebook 07 (workbench.studies.your_model), in one process on stored runs: it shows only the model of its
parameter cell (issue 29, item 6: with CONFIG set it showed the example model's stored runs as "your model"),
with that model's precision, N, bucket size, activations and size as people write it; and it holds each run's
peak against the prediction made from a profile (issue 26)."""

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from workbench.core.buckets import plan_buckets
from workbench.models.init import LMConfig
from workbench.runs.estimate import estimate_run_activation_bytes, estimate_run_memory, spec_from_row
from workbench.runs.profile import profile_from_measurements, profile_key_fields
from workbench.runs.spec import RunSpec
from workbench.runs.tables import load_runs
from workbench.studies.checks import user_model_checks
from workbench.studies.design_review import reference_runs_dir
from workbench.studies.memory import memory_validation
from workbench.studies.runs import summarize_runs
from workbench.core.units import MiB, format_count
from workbench.studies.your_model import default_communication_size, load_model_runs, memory_estimates, your_model
from workbench.studies.your_model_memory import JAX_PEAK_CAUSE, peak_table

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "07_your_model.ipynb"
EXAMPLE = dict(model="examples.tiny_mlp_lm:mlx_factory", jax_model="examples.tiny_mlp_lm:jax_factory",
               data=str(ROOT / "examples" / "data" / "markov_v256.bin"), vocab_size=256, seq_len=32)
#: A Llama-style config.json of 44.4M parameters, published in bfloat16, as a user would paste it.
LLAMA_44M = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 512, "num_hidden_layers": 4,
             "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 1216,
             "tie_word_embeddings": False, "torch_dtype": "bfloat16", "max_position_embeddings": 2048}


#: A small Llama config.json (the published fields mlx-lm's ModelArgs needs), in float32.
LLAMA_SMALL = {"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "rms_norm_eps": 1e-5,
               "tie_word_embeddings": False, "torch_dtype": "float32"}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A run store holding other models' runs: the reference runs of the built-in LM (the stand-in for "the
    example model's runs" a store kept after the parameter cell changed)."""
    root = tmp_path_factory.mktemp("your-model") / "runs"
    shutil.copytree(reference_runs_dir("memory"), root)
    return root


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    """Where config_factory writes its modules, importable as engines import them (its parent on sys.path)."""
    folder = tmp_path_factory.mktemp("cfg") / "wbtest_your_configs"
    sys.path.insert(0, str(folder.parent))
    yield folder
    sys.path.remove(str(folder.parent))


def stored_specs(root):
    """The specs of the runs stored under ``root``, from their records (as the driver wrote them)."""
    return [RunSpec(**json.loads(p.read_text())["spec"]) for p in sorted(root.glob("*/record.json"))]


def test_a_config_shows_none_of_the_stored_runs_of_another_model_only_its_own(store, configs):
    everything = load_runs(store)
    assert len(everything.runs) == 7  # the store does hold runs: of another model
    model = your_model(model=EXAMPLE["model"], config=LLAMA_SMALL, data=EXAMPLE["data"], vocab_size=256, seq_len=32,
                       strategies=("ddp", "fsdp-row"), steps=3, global_batch=8, config_folder=configs)
    factories = {s.model_factory for s in model.run_specs}
    assert [s.framework for s in model.run_specs] == ["mlx", "mlx"] and len(factories) == 1
    assert factories.pop().startswith("wbtest_your_configs.your_configs.config_")  # the config's, not MODEL's
    assert model.spec.num_params == 106_816 and model.precision == "float32"
    assert len(model.notes) == 1 and "JAX" in model.notes[0] and "\n" not in model.notes[0]
    shown = load_model_runs(everything, model.run_specs)
    assert shown.runs.empty and shown.steps.empty
    # another config is another model: another factory module, so other run ids
    wider = your_model(model=None, config={**LLAMA_SMALL, "intermediate_size": 192}, data=EXAMPLE["data"],
                       vocab_size=256, seq_len=32, strategies=("ddp",), steps=3, global_batch=8, config_folder=configs)
    assert wider.run_specs[0].model_factory != model.run_specs[0].model_factory
    # a factory's runs are its own: none of the built-in LM's, though the store holds them
    factory = your_model(**EXAMPLE, strategies=("ddp", "fsdp-row"), steps=3, global_batch=8)
    assert [s.framework for s in factory.run_specs] == ["mlx", "mlx", "jax", "jax"]
    assert load_model_runs(everything, factory.run_specs).runs.empty
    # and the filter is not empty-handed by construction: asked for the stored specs, it returns exactly them
    again = load_model_runs(everything, stored_specs(store)[:3])
    assert list(again.runs.run_id) == list(everything.runs.run_id[:3])
    assert set(again.steps.run_id) == set(again.runs.run_id)


def test_notebook_07_reads_runs_only_through_its_models_filter():
    cells = ["".join(c["source"]) for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "code"]
    code = "\n".join(cells)
    assert code.count("load_runs(") == code.count("load_model_runs(load_runs(RUNS), model.run_specs)") == 1
    assert '"float32"' not in "\n".join(cells[2:]), "a precision forced outside the parameter cell"
    assert "plan_shards(buckets, model.num_ranks" in code and "build_explorer(model, CONFIG" in code


def test_a_config_keeps_its_precision_its_architecture_and_its_size_in_words(configs):
    model = your_model(model=None, config=LLAMA_44M, vocab_size=32000, seq_len=128, num_ranks=4, memory_bytes=10**6,
                       config_folder=configs)
    assert model.precision == "bfloat16" and {p.dtype for p in model.spec.params} == {"bfloat16"}
    assert format_count(model.spec.num_params) == "44.4M"
    assert "44.4M parameters" in model.memory_title() and "B parameters" not in model.memory_title()
    few, many = (plan_buckets(model.spec, size).summary()["num_buckets"] for size in (model.communication_size, 16384))
    assert model.communication_size == 16 * 2**20 and 1 < few <= 8 < many  # not one bucket per array, as at 16 KiB
    estimates = memory_estimates(model, ["ddp", "zero3"], [8, 64], seq_len=128, micro_batch=2)
    assert sorted({e.num_shards for e in estimates}) == [4, 8, 64]  # the runs' N joins the bars
    assert all(e["activations"] > 0 for e in estimates)  # the config carries the architecture
    # too large for the memory given: said in one line, and still planned
    assert model.run_specs == () and len(model.notes) == 1 and "not trained here" in model.notes[0]
    fp32 = your_model(model=None, config=LLAMA_44M, vocab_size=32000, seq_len=128, precision="float32",
                      config_folder=configs, memory_bytes=10**6)
    assert fp32.spec.nbytes == 2 * model.spec.nbytes
    # a config's runs keep its precision and N
    small = your_model(model=None, config={**LLAMA_SMALL, "torch_dtype": "bfloat16"}, data=EXAMPLE["data"],
                       vocab_size=256, seq_len=32, num_ranks=4, steps=3, global_batch=8, config_folder=configs)
    assert small.run_specs and {(s.num_ranks, s.precision) for s in small.run_specs} == {(4, "bfloat16")}


def test_bucket_sizes_follow_the_models_size():
    assert default_communication_size(82_304) == 16 * 1024  # the example MLP: several buckets
    assert default_communication_size(4 * 44_400_000) == 32 * 2**20  # MLX's default
    assert default_communication_size(100) == 4 * 1024


def test_a_factory_too_large_for_the_machine_is_planned_and_says_so():
    model = your_model(**EXAMPLE, num_ranks=2, steps=3, global_batch=8, memory_bytes=1000)
    assert model.run_specs == () and len(model.notes) == 1 and "not trained here" in model.notes[0]
    ok = your_model(**EXAMPLE, num_ranks=4, precision="bfloat16", steps=3, global_batch=8)
    assert {(s.num_ranks, s.precision) for s in ok.run_specs} == {(4, "bfloat16")}
    assert {p.dtype for p in ok.spec.params} == {"bfloat16"}


def closed_formula_profile(spec):
    """A profile whose activations are the closed formula's, measured at 1 and 2 sequences (the built-in LM's
    activations are linear in the micro-batch), so its prediction is the run's estimate."""
    config = LMConfig(**spec["model"])
    samples = [[estimate_run_activation_bytes(config, b, spec["precision"])] for b in (1, 2)]
    measured = {"micro_batch_sizes": [1, 2], "activation_samples": samples, "compute_s_samples": [[0.1], [0.2]],
                "parameter_bytes": 1, "gradient_bytes": 1, "optimizer_state_bytes": 2, "update_s": 0.01,
                "truth_source": "closed formula", "peak_rss_bytes": 1}
    return profile_from_measurements(measured, profile_key_fields(spec, 1), cost_s=1.0)


def test_each_runs_peak_is_held_against_its_profiles_prediction_and_the_check_names_a_miss(store):
    loaded = load_runs(store)
    specs = {spec_from_row(r)["framework"]: spec_from_row(r) for _, r in loaded.runs.iterrows()}
    profiles = {fw: closed_formula_profile(spec) for fw, spec in specs.items()}
    peaks = peak_table(loaded, profiles)
    assert len(peaks) == 7
    for _, run in loaded.runs.iterrows():  # the prediction is the run's estimate; the peak its ranks' largest
        spec = spec_from_row(run)
        row = peaks[peaks.run == f"{spec['framework']} {spec['strategy']}"].iloc[0]
        estimate = estimate_run_memory(spec)  # XLA's plan (these JAX runs) beside what a plan can hold
        scratch = estimate["collective_scratch"]
        assert row.predicted_bytes == estimate.total_bytes - (scratch if spec["framework"] == "jax" else 0)
        assert (scratch > 0) == (spec["framework"] == "jax" and spec["strategy"] == "fsdp-full")
        assert row.measured_bytes == max(r["measured_memory"]["peak"] for r in run["summary.ranks"])
    jax, mlx = peaks[peaks.framework == "jax"], peaks[peaks.framework == "mlx"]
    assert jax.within.isna().all() and (jax.cause == JAX_PEAK_CAUSE).all()  # XLA's plan: shown, not held
    assert mlx.within.all() and ((mlx.ratio - 1).abs() <= 0.10).all()  # notebook 03 holds these runs alike
    summary, validation = summarize_runs(loaded), memory_validation(loaded)
    claim = "every measured peak within 10% of its profile's prediction"
    assert user_model_checks(summary, len(summary), validation, 512, peaks)[claim]
    missed = peaks.assign(within=[None if w is None else i != 3 for i, w in enumerate(peaks.within)])
    assert not user_model_checks(summary, len(summary), validation, 512, missed)[claim]
    unheld = peaks.assign(within=None)  # nothing held is not a pass
    assert not user_model_checks(summary, len(summary), validation, 512, unheld)[claim]
    assert claim not in user_model_checks(summary, len(summary), validation, 512)


def test_a_jax_run_that_read_its_truth_is_held_and_a_miss_names_its_term(store):
    """A JAX rank that stored its truth (``truth_peak``) is held to 10% like an MLX rank, its largest rank's truth
    the measurement; a miss names its term from XLA's plan beside it (:func:`~workbench.studies.memory.peak_cause`)."""
    import copy

    loaded = load_runs(store)
    specs = {spec_from_row(r)["framework"]: spec_from_row(r) for _, r in loaded.runs.iterrows()}
    profiles = {fw: closed_formula_profile(spec) for fw, spec in specs.items()}
    jax_rows = loaded.runs.index[loaded.runs["spec.framework"] == "jax"]
    truths = {}
    for k, i in enumerate(jax_rows):  # rank 1 reads 1.02 of the estimate on the first run, 1.7 of the plan on the next
        ranks = copy.deepcopy(loaded.runs.at[i, "summary.ranks"])
        predicted = estimate_run_memory(spec_from_row(loaded.runs.loc[i])).total_bytes
        ranks[1]["measured_memory"].update(truth_peak=int(1.02 * predicted) if k == 0 else
                                           int(1.7 * ranks[1]["measured_memory"]["peak"]), truth_source="VmHWM")
        ranks[0]["measured_memory"].update(truth_peak=int(0.5 * predicted), truth_source="VmHWM")
        loaded.runs.at[i, "summary.ranks"] = ranks
        truths[loaded.runs.at[i, "spec.strategy"]] = ranks[1]["measured_memory"]["truth_peak"]
    peaks = peak_table(loaded, profiles).set_index("run")
    assert len(truths) == 2
    first, second = (f"jax {s}" for s in truths)
    assert peaks.loc[[first, second], "measured_bytes"].tolist() == [truths[first[4:]], truths[second[4:]]]
    assert peaks.loc[[first, second], "within"].tolist() == [True, False] and peaks.loc[first, "cause"] == ""
    assert re.search(r"\+\d+% against XLA's plan( and the collective scratch)? \(buffers outside the compiled step",
                     peaks.loc[second, "cause"]), peaks.loc[second, "cause"]


def test_a_profile_of_another_model_is_refused(store):
    loaded = load_runs(store)
    spec = spec_from_row(loaded.runs.iloc[2])  # mlx ddp
    other = closed_formula_profile({**spec, "model": {**spec["model"], "dim": 128}})
    with pytest.raises(ValueError, match="another model"):
        peak_table(loaded, {"mlx": other})


def test_the_explorer_is_offered_on_the_users_model(configs):
    from workbench.studies.your_model import build_explorer

    config = your_model(model=None, config=LLAMA_SMALL, vocab_size=256, seq_len=32, memory_bytes=1, config_folder=configs)
    explorer = build_explorer(config, LLAMA_SMALL, seq_len=32, micro_batch=4)
    assert explorer.controls["model"].value == LLAMA_SMALL and explorer.controls["param_dtype"].value == "float32"
    assert explorer.estimates and all(e["activations"] > 0 for e in explorer.estimates)
    factory = your_model(**EXAMPLE, steps=3, global_batch=8)
    explorer = build_explorer(factory, None, seq_len=32, micro_batch=4)
    assert explorer.controls["model"].value is factory.spec and explorer.estimates[0].num_params == 20_576


def test_the_profile_table_shows_the_activation_line_a_run_of_its_ranks_is_predicted_from():
    """A JAX profile's truth is one device's; a rank of two is predicted from it scaled by XLA's plan on a mesh of
    two (here 3/4 of the one-device plan at both sizes). Notebook 07's table shows that line, named, for its runs."""
    from workbench.studies.your_model_memory import profile_table

    spec = RunSpec(framework="jax", model=dict(vocab_size=64, seq_len=32, dim=64, num_layers=2, num_heads=4,
                                                mlp_dim=128)).to_dict()
    measured = {"micro_batch_sizes": [1, 2], "activation_samples": [[4 * MiB], [8 * MiB]],
                "compute_s_samples": [[0.1], [0.2]], "parameter_bytes": 1, "gradient_bytes": 1,
                "optimizer_state_bytes": 2, "update_s": 0.01, "truth_source": "VmHWM, after a reset",
                "peak_rss_bytes": 1, "plan_activation_bytes": [4 * MiB, 8 * MiB],
                "mesh_plan_activation_bytes": [3 * MiB, 6 * MiB]}
    profile = profile_from_measurements(measured, profile_key_fields(spec, 1), cost_s=1.0)
    one, two = profile_table({"jax": profile}, 2)["jax"], profile_table({"jax": profile}, 2, num_ranks=2)["jax"]
    assert one["activations at 2 sequences"] == "8.00 MiB" and one["activations per sequence"] == "4.00 MiB"
    assert two["activations at 2 sequences, a rank of 2"] == "6.00 MiB"
    assert two["activations per sequence, a rank of 2"] == "3.00 MiB" and two["peak read as"] == "VmHWM"

"""Real profiles (issue 26): the built-in LM and examples/tiny_mlp_lm measured on one process in MLX, and the
attention example's runs' own profiles in MLX and JAX (JAX's truth beside XLA's plans), reused from the cache;
and the check that matters, a causal-attention model's peak (examples/tiny_attention_lm,
128 tokens) on 2 real ranks, in MLX and JAX, under ddp, fsdp-row, fsdp-flat and fsdp-full, held to 10% of the
prediction made from its profile (the closed formula missed it 4 to 5 times), and the MLX runs' step time set
beside the one predicted from the profile."""

import contextlib
import dataclasses
import os

import pytest

import workbench.launch.profile as launch_profile
from conftest import nbval_sweep, store_in
from held_peaks import assert_held, rank_peaks
from workbench.core.paths import NOTEBOOK_DIR
from workbench.launch.profile import profile_model
from workbench.runs.estimate import estimate_run_memory, run_step_shape, spec_from_row, step_time_validation
from workbench.runs.profile import PROFILE_DIR, load_profile, profile_path
from workbench.runs.spec import RunSpec
from workbench.runs.tables import load_runs
from workbench.strategies import get_strategy
from workbench.studies.design_review import reference_runs_dir
from workbench.studies.step_time import fit_links, load_collective_benchmarks

TINY_LM = dict(vocab_size=64, seq_len=32, dim=64, num_layers=2, num_heads=4, mlp_dim=128)
MLP = 20_576  # examples.tiny_mlp_lm's parameters
ATTENTION = dict(vocab_size=384, seq_len=128)  # examples.tiny_attention_lm: 2 blocks, d=96, 4 heads


def lm_spec(framework):
    return RunSpec(framework=framework, model=TINY_LM, global_batch=8)


def mlp_spec(framework):
    return RunSpec(framework=framework, model_factory=f"examples.tiny_mlp_lm:{framework}_factory",
                   model=dict(vocab_size=256, seq_len=32), global_batch=8)


def check_profile(profile, spec, sizes, repeats):
    """What every real profile holds (``sizes`` measured ``repeats`` times by each of the run's ranks at once)."""
    logits = spec.model["seq_len"] * spec.model["vocab_size"] * 4  # one fp32 logits row per sequence
    fit = profile.activation_fit
    runners = profile.co_runners  # as many processes at once as the run has ranks, each measuring `repeats` times or
    # more (a quick size is sampled on for a quarter second, up to 8 times), their samples pooled
    assert profile.micro_batch_sizes == sizes
    assert all(repeats * runners <= len(s) <= max(8, repeats) * runners for s in profile.activation_samples)
    assert runners == spec.num_ranks and profile.key_fields["co_runners"] == runners
    assert fit.slope >= logits, (profile.activation_samples, logits)  # backward keeps the logits, at least
    assert profile.activation_bytes_at(sizes[-1]) >= sizes[-1] * logits
    assert profile.optimizer_state_bytes >= 2 * profile.parameter_bytes  # AdamW's two moments
    assert all(t > 0 for s in profile.compute_s_samples for t in s) and profile.update_s > 0
    # what the step-time prediction takes besides: the forward alone (recomputed where units reshard), the cores
    assert [len(s) for s in profile.forward_s_samples] == [repeats * runners] * len(sizes)
    assert all(t > 0 for s in profile.forward_s_samples for t in s)
    assert profile.cores == os.cpu_count() and profile.key_fields["threads"] >= 1
    # the rank's real step, timed beside its parts: what it takes beyond them is a term of the prediction
    steps = (profile.step_s_samples, profile.step_bare_s_samples, profile.step_update_s_samples)
    assert [len(s) for s in steps] == [max(5, repeats) * runners] * 3 and all(t > 0 for s in steps for t in s)
    assert profile.step_overhead_s >= 0
    assert profile.cost_s > 0 and profile.cost_peak_rss_bytes > profile.parameter_bytes


def check_cached(spec, root, profile, monkeypatch):
    """The profile is stored under ``root`` and read back, never measured again, whatever sizes a run would pick."""
    path = profile_path(root, profile.key_fields)
    assert load_profile(path) == profile and path.parent == root / ".profiles"

    def measure_again(*args, **kwargs):
        raise AssertionError("profiled again although the profile is cached")

    monkeypatch.setattr(launch_profile, "_run_bounded", measure_again)
    assert profile_model(spec, root) == profile


@pytest.mark.parametrize("model", ["lm", "mlp"])
def test_a_real_mlx_profile_measures_activations_that_grow_with_the_micro_batch(tmp_path, monkeypatch, model):
    """MLX's profile of the built-in LM and of a factory (the example MLP). JAX's is read on the attention runs'
    own profile below (:func:`test_jax_reads_the_truth_beside_xlas_plans_on_one_device_and_on_a_mesh`)."""
    spec = (lm_spec if model == "lm" else mlp_spec)("mlx")
    profile = profile_model(spec, tmp_path, micro_batch_sizes=(1, 4), repeats=2)
    check_profile(profile, spec, (1, 4), 2)
    # these models' backward takes milliseconds: sampled beyond the 2 asked
    assert all(len(s) > 2 * profile.co_runners for s in profile.activation_samples), profile.activation_samples
    if model == "mlp":
        assert profile.parameter_bytes == profile.gradient_bytes == MLP * 4
    # the ZeRO-3 step on one rank: measured where the model has blocks (the LM's `layers`; the MLP has none)
    assert (profile.zero3_rise_samples is not None) == (model == "lm")
    assert profile.plan_activation_bytes is None and profile.cost_peak_array_bytes > profile.parameter_bytes
    assert profile.mesh_activation_fit is None and profile.activation_bytes_at(4, 2) == profile.activation_bytes_at(4)
    check_cached(spec, tmp_path, profile, monkeypatch)


STRATEGIES = ("ddp", "fsdp-row", "fsdp-flat", "fsdp-full")


@pytest.fixture(scope="module")
def attention_runs(tmp_path_factory, shared_runs, engine_pool):
    """Each framework's runs under each strategy, in a store of their own, and its profile. They are notebook 07's
    runs of its example, fsdp-row added where its small configuration leaves it out, trained in the notebook's
    folder (its data path is from there): nbval, after the tests, finds them and the profiles in its store."""
    store, wanted = nbval_sweep("07_your_model")
    roots, specs = {}, {}
    with contextlib.chdir(NOTEBOOK_DIR):
        for framework in ("mlx", "jax"):
            roots[framework] = root = tmp_path_factory.mktemp(f"attention-{framework}")
            mine = {s.strategy: s for s in wanted.values() if s.framework == framework}
            mine.setdefault("fsdp-row", dataclasses.replace(mine["ddp"], strategy="fsdp-row"))
            specs[framework] = [mine[s] for s in STRATEGIES]
            assert {(s.model_factory, s.model["seq_len"], s.num_ranks, s.global_batch) for s in specs[framework]} == {
                (f"examples.tiny_attention_lm:{framework}_factory", 128, 2, 16)}, "notebook 07's example changed"
            outcomes = [shared_runs.run(s, root, pool=engine_pool) for s in specs[framework]]
            assert [o.status for o in outcomes] == ["done"] * 4, outcomes
        engine_pool.close()  # no idle engine beside the profiles' timing
        # 2 processes at once, as the 2 ranks ran
        profiles = {framework: profile_model(specs[framework][0], roots[framework]) for framework in roots}
    for framework, profile in profiles.items():
        store_in(store / PROFILE_DIR, profile_path(roots[framework], profile.key_fields))
    return roots, profiles, specs


def test_jax_reads_the_truth_beside_xlas_plans_on_one_device_and_on_a_mesh(attention_runs, monkeypatch):
    """JAX's profile of a factory (the attention example, at the run's sizes): the process's high-water mark
    (VmHWM) beside XLA's plan of the one-device program, and XLA's plan of the same on a mesh of two devices, as a
    rank of two compiles it: the line a run of two takes scales the truth by it, size by size."""
    roots, profiles, specs = attention_runs
    profile, spec = profiles["jax"], specs["jax"][0]
    sizes = profile.micro_batch_sizes
    check_profile(profile, spec, sizes, 3)
    assert profile.zero3_rise_samples is None and profile.truth_source.startswith("VmHWM")
    assert len(profile.plan_activation_bytes) == len(sizes) and all(p > 0 for p in profile.plan_activation_bytes)
    assert len(profile.mesh_plan_activation_bytes) == len(sizes) and all(p > 0 for p in profile.mesh_plan_activation_bytes)
    scaled = [max(s) * m / p for s, p, m in zip(profile.activation_samples, profile.plan_activation_bytes,
                                                profile.mesh_plan_activation_bytes)]
    # the lines through the run's 3 sizes: at the largest, within 2% of the scaled truth and of the truth
    assert profile.activation_bytes_at(sizes[-1], 2) == pytest.approx(scaled[-1], rel=0.02)
    assert profile.activation_bytes_at(sizes[-1]) == pytest.approx(max(profile.activation_samples[-1]), rel=0.02)
    assert profile.activation_bytes_at(sizes[-1], 2) != profile.activation_bytes_at(sizes[-1])  # the mesh's own
    with contextlib.chdir(NOTEBOOK_DIR):  # the spec's data path is the notebook's
        check_cached(spec, roots["jax"], profile, monkeypatch)


def test_an_attention_models_peak_on_two_ranks_is_its_profiles_prediction_within_ten_percent(attention_runs):
    """Every rank of the example factory's runs, MLX and JAX, held to 10% of the peak its profile predicts; the
    closed formula's logits-only estimate was 3x or more below each. MLX's full sharding wraps the model's `blocks`
    (the units its plan counts), not the whole model: its peak was 48.1 MiB as one unit, 1.11x a prediction from
    the kept activations; it is 36.0, and the profile's ZeRO-3 step on one rank predicts it (1.02). JAX's peaks
    read 0.92-0.98 of a prediction from the one-device truth: XLA plans a rank's step on a mesh of two below the
    one-device program, and the profile's plan on a mesh scales it (1.01-1.06)."""
    roots, profiles, _ = attention_runs
    rows = []
    for framework, root in roots.items():
        rows += rank_peaks(root, lambda spec: ("attention", profiles[spec["framework"]]))
        for _, run in load_runs(root).runs.iterrows():
            spec = spec_from_row(run)
            before = estimate_run_memory(spec, run["model_shapes"]).total_bytes
            assert all(rank["measured_memory"].get("truth_peak", rank["measured_memory"]["peak"]) > 3 * before
                       for rank in run["summary.ranks"]), spec["strategy"]  # the logits-only estimate
            if framework == "mlx":  # each rank issued the collectives its plan counts (block units, for full)
                planned = get_strategy(spec["strategy"]).collective_counts(run_step_shape(spec, run["model_shapes"]))
                assert [r["collectives"] for r in run["summary.ranks"]] == [planned] * 2, (spec["strategy"], planned)
    assert_held(rows, 2 * len(STRATEGIES) * 2)
    profile = profiles["mlx"]
    assert profile.zero3_rise_fit is not None and all(len(r) >= 3 for r in profile.zero3_rise_samples)
    peaks = {(fw, s): measured for _, fw, s, _, _, measured, *_ in rows}
    # the blocks gathered one at a time and recomputed: below DDP (36.0 MiB against 39.9)
    assert peaks["mlx", "fsdp-full"] < 0.95 * peaks["mlx", "ddp"], peaks


def test_each_runs_step_time_is_measured_beside_its_prediction_from_the_profile(attention_runs):
    """The step time of the same two runs, predicted from the profile and the committed MLX loopback links, and
    measured. Timings under load are not held here (bench_step_prediction.py shows them): the measured step is
    set beside every term of the prediction, and the two are the same order of magnitude. The profile was taken
    by 2 processes at once (the run's ranks on this host), and the trainer's overhead is in the prediction."""
    roots, profiles, _ = attention_runs
    root, profile = roots["mlx"], profiles["mlx"]
    assert profile.co_runners == 2 and len(profile.compute_s_samples[0]) >= 2 * 3  # 3 repeats or more by each process
    links = fit_links(load_collective_benchmarks(reference_runs_dir("collectives")))
    table = step_time_validation(load_runs(root), profile, links).set_index("strategy")
    assert sorted(table.index) == sorted(STRATEGIES)
    for strategy, row in table.iterrows():
        assert row.compute_ms > 0 and row.update_ms > 0 and row.comm_ms > 0, row
        assert row.overhead_ms == pytest.approx(profile.step_overhead_s * 1e3) and row.num_microbatches == 1
        assert row.predicted_ms == pytest.approx(row.compute_ms + row.update_ms + row.comm_ms + row.per_bucket_ms
                                                 + row.overhead_ms)
        assert row.measured_ms > 0 and row.ratio == pytest.approx(row.measured_ms / row.predicted_ms)
        assert row.measured_sync_ms >= 0 if strategy != "fsdp-full" else row.measured_sync_ms != row.measured_sync_ms  # NaN: in its passes
        assert 0.2 < row.ratio < 5, (strategy, row.why)
        assert row.within == (abs(row.ratio - 1) <= 0.10) and isinstance(row.off_term, str) != row.within
    assert table.loc["fsdp-row", "update_ms"] < table.loc["ddp", "update_ms"]  # it updates its half

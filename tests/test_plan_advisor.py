"""The plan advisor in one process (issue 27): what it enumerates, what the models rule out, how it ranks, why,
the Pareto figure, the JSON other tools read, and the command line's errors. The profile and the links are
built here (real dataclasses: a ModelProfile from measurements, fitted AlphaBeta links); nothing is run."""

import functools
import json
from dataclasses import replace

import plotly.graph_objects as go
import pytest

from workbench.__main__ import main
from workbench.core.buckets import plan_buckets
from workbench.core.specs import spec_from_flat
from workbench.core.units import GiB, KiB, MiB
from workbench.estimate.advisor import default_sizes
from workbench.estimate.comm import AlphaBeta
from workbench.runs.profile import profile_from_measurements, profile_key_fields
from workbench.runs.spec import VALIDATION_MODEL, RunSpec
from workbench.strategies import get_strategy
from workbench.studies.planner import advise_plan, base_spec, enumerate_candidates, validation_plans
from workbench.studies.planner.candidates import model_of
from workbench.studies.planner.cli import parse_memory, plan_json
from workbench.studies.planner.tables import advice_table, strategy_table
from workbench.studies.planner.validate import off_terms
from workbench.views.plan_pareto import fig_plan_pareto, pareto_front

LINKS = {(fw, kind): AlphaBeta(200e-6, 1e9) for fw in ("mlx", "jax")
         for kind in ("all_reduce", "all_gather", "reduce_scatter")}


def fake_profile(base: RunSpec, *, act_per_seq: int = 3_000_000, compute_per_seq: float = 0.005):
    """A profile as a profiling program would write it: activations and compute linear in b, with an intercept."""
    p = 13_673_472
    measured = {"micro_batch_sizes": [1, 4, 8],
                "activation_samples": [[1_000_000 + b * act_per_seq] for b in (1, 4, 8)],
                "compute_s_samples": [[0.004 + b * compute_per_seq] for b in (1, 4, 8)], "parameter_bytes": p,
                "gradient_bytes": p, "optimizer_state_bytes": 2 * p, "update_s": 0.012, "truth_source": "test",
                "plan_activation_bytes": None, "peak_rss_bytes": 1, "peak_array_bytes": 1, "versions": {}}
    return profile_from_measurements(measured, profile_key_fields(base, 1), 1.0)


@functools.lru_cache(maxsize=None)
def advise(memory_bytes, framework="mlx"):
    """The advice for the validation LM on 2 ranks at ``memory_bytes`` (pure: computed once a session)."""
    base = base_spec(dict(VALIDATION_MODEL), num_ranks=2, global_batch=16, seq_len=None, framework=framework)
    return advise_plan(dict(VALIDATION_MODEL), num_ranks=2, memory_bytes=memory_bytes, global_batch=16,
                       framework=framework, runs_root="unused", profile=fake_profile(base), links=LINKS)


def test_every_runnable_plan_is_enumerated_each_once():
    base = base_spec(dict(VALIDATION_MODEL), num_ranks=2, global_batch=16, seq_len=None, framework="mlx")
    model = model_of(base)
    specs, left_out = enumerate_candidates(base, model)
    assert left_out == [] and len({s.to_dict().__repr__() for s in specs}) == len(specs)
    by = {}
    for s in specs:
        by.setdefault(s.strategy, set()).add((s.communication_size, s.num_microbatches, s.defer_sync))
    assert set(by) == {"ddp", "fsdp-row", "fsdp-flat", "fsdp-full", "mlx-fully-shard"}
    # every size of the advisor's sweep that gives its own buckets; one size where units, not buckets, sync
    sweep = default_sizes(model)
    assert {c for c, _, _ in by["ddp"]} == {c for c, _, _ in by["fsdp-row"]} == set(sweep) - {16 * MiB} | {16 * MiB}
    assert len({c for c, _, _ in by["fsdp-full"]}) == len({c for c, _, _ in by["mlx-fully-shard"]}) == 1
    # micro-batch x G makes the per-rank batch of 8: G in 1, 2, 4, 8, deferred or every micro-batch
    assert {(g, d) for _, g, d in by["ddp"]} == {(1, True), (2, True), (2, False), (4, True), (4, False), (8, True),
                                                 (8, False)}
    assert all(not d or g == 1 for _, g, d in by["mlx-fully-shard"])  # fully_shard cannot defer its sync
    assert all(s.micro_batch_size * s.num_microbatches * 2 == 16 for s in specs)
    jax_specs, _ = enumerate_candidates(base_spec(dict(VALIDATION_MODEL), num_ranks=2, global_batch=16, seq_len=None,
                                                  framework="jax"), model)
    assert "mlx-fully-shard" not in {s.strategy for s in jax_specs}
    # two sizes that give one bucket plan are one candidate
    assert plan_buckets(model, 16 * MiB).num_buckets == plan_buckets(model, 32 * MiB).num_buckets == 1
    assert 32 * MiB not in {c for c, _, _ in by["ddp"]}


def test_the_pick_fits_is_fastest_of_those_that_fit_and_every_plan_says_why():
    roomy = advise(4 * GiB)
    ddp = [c for c in roomy.candidates if c.spec.strategy == "ddp"]
    fsdp = [c for c in roomy.candidates if get_strategy(c.spec.strategy).sharded.optimizer
            and get_strategy(c.spec.strategy).units == "buckets"]
    # a budget that DDP's smallest plan cannot keep, and FSDP's smallest can, with the 10% margin
    budget = int(min(c.predicted_peak_bytes for c in fsdp) * 1.1 + 0.5 * (
        min(c.predicted_peak_bytes for c in ddp) * 1.1 - min(c.predicted_peak_bytes for c in fsdp) * 1.1))
    advice = advise(budget)
    pick = advice.recommended
    assert pick is not None and pick.fits and pick.rank == 1 and pick.predicted_peak_bytes * 1.1 <= budget
    assert pick.predicted_step_s == min(c.predicted_step_s for c in advice.candidates if c.fits)
    assert not any(c.fits for c in advice.candidates if c.spec.strategy == "ddp")
    per_strategy = strategy_table(advice)  # memory per strategy: DDP's smallest is over, the pick's strategy fits
    assert not per_strategy.loc["ddp", "fits"] and per_strategy.loc[pick.spec.strategy, "fits"]
    assert per_strategy.loc["ddp", "smallest peak MiB"] * MiB * 1.1 > budget
    worst_ddp = max((c for c in advice.candidates if c.spec.strategy == "ddp"), key=lambda c: c.predicted_peak_bytes)
    assert worst_ddp.reason.startswith("DDP does not fit: ") and " > " in worst_ddp.reason
    # the default bucket size (one bucket of the whole model) does not fit; the pick's buckets are smaller
    default_plan = plan_buckets(model_of(pick.spec), RunSpec().communication_size)
    assert plan_buckets(model_of(pick.spec), pick.spec.communication_size).num_buckets > default_plan.num_buckets
    assert pick.reason.startswith("the pick: fastest plan that fits")
    ranks = [c.rank for c in advice.candidates]
    assert ranks == list(range(1, len(ranks) + 1))
    fitting = [c for c in advice.candidates if c.fits]
    assert [c.predicted_step_s for c in fitting] == sorted(c.predicted_step_s for c in fitting)
    assert all(c.reason for c in advice.candidates)
    slower = next(c for c in fitting if c.predicted_step_s > pick.predicted_step_s * 1.001)
    assert "slower than the pick:" in slower.reason
    flat = next(c for c in advice.candidates if c.flat_padding >= 0.005) if any(
        c.flat_padding >= 0.005 for c in advice.candidates) else None
    assert flat is None or "flat pads" in flat.reason


def test_nothing_fits_recommends_nothing_and_runs_nothing():
    advice = advise(1 * MiB)
    assert advice.recommended is None and not any(c.fits for c in advice.candidates)
    assert any(n.startswith("no plan fits: the smallest peak is") for n in advice.notes)
    assert validation_plans(advice) == []


def test_validation_runs_the_pick_the_runner_up_and_ddp_or_the_smallest_whole_parameter_plan():
    roomy = advise(4 * GiB)
    plans = validation_plans(roomy)
    assert [r for r, _ in plans][0] == "pick" and plans[0][1] is roomy.recommended
    assert {r for r, _ in plans} == {"pick", "runner-up", "ddp"}
    assert next(c for r, c in plans if r == "ddp").spec.strategy == "ddp"
    runner = next(c for r, c in plans if r == "runner-up")
    pick = roomy.recommended.spec
    assert (runner.spec.strategy, runner.spec.num_microbatches, runner.spec.defer_sync) != (
        pick.strategy, pick.num_microbatches, pick.defer_sync)  # not the pick at another bucket size
    ddp_min = min(c.predicted_peak_bytes for c in roomy.candidates if c.spec.strategy == "ddp")
    tight = advise(int(ddp_min * 1.1) - 1)
    roles = dict(validation_plans(tight))
    assert "ddp" not in roles and "ddp-like" in roles or roles["runner-up"].spec == min(
        (c for c in tight.candidates if c.fits and not get_strategy(c.spec.strategy).gathers_units),
        key=lambda c: c.predicted_peak_bytes).spec  # (the runner-up may already be that plan)
    whole = [c for r, c in validation_plans(tight) if r == "ddp-like"]
    assert all(c.fits and not get_strategy(c.spec.strategy).gathers_units and c.spec.strategy != "ddp" for c in whole)


def test_a_missed_target_names_the_term_that_was_off():
    pick = advise(4 * GiB).recommended
    s = pick.step
    after = s.comm_s + s.per_bucket_s + s.update_s + s.overhead_s  # what the ranks time after the backward
    assert off_terms(pick, pick.predicted_step_s, after, pick.predicted_peak_bytes) == ()
    # after the backward at twice its price plus half a step, the forward and backward as predicted
    slow = 2 * after + 0.5 * pick.predicted_step_s
    off = off_terms(pick, s.compute_s + slow, slow, pick.predicted_peak_bytes)
    assert len(off) == 1 and off[0].startswith("the sync and update (collectives, per-bucket cost, optimizer, "
                                               "overhead) are underpriced")
    off = off_terms(pick, 1.3 * s.compute_s + after, after, int(pick.predicted_peak_bytes * 1.2))
    assert off[0].startswith("forward and backward 30% over") and off[1].startswith("peak 20% over")


def test_the_pareto_figure_marks_the_budget_and_the_pick():
    advice = advise(200 * MiB)
    assert advice.recommended is not None
    rows = [c.to_dict() for c in advice.candidates]
    fig = fig_plan_pareto(rows, advice.memory_bytes, safety_margin=0.1, recommended=advice.recommended.to_dict())
    go.Figure(fig.to_dict())  # valid plotly
    lines = [s for s in fig.layout.shapes if s.x0 == s.x1]
    assert [round(s.x0, 6) for s in lines] == [round(200.0, 6), round(200 / 1.1, 6)]
    star = next(t for t in fig.data if t.marker.symbol == "star")
    assert star.x[0] == advice.recommended.predicted_peak_bytes / MiB
    assert pareto_front([(1, 5), (2, 3), (3, 4), (0.5, 9), (2, 3.5)]) == [3, 0, 1]


def test_the_json_carries_the_fields_other_tools_read():
    advice = advise(200 * MiB)
    out = json.loads(json.dumps(plan_json(advice)))
    keys = {"strategy", "layout", "communication_size", "micro_batch_size", "num_microbatches",
            "predicted_peak_bytes", "predicted_step_s", "fits"}
    assert keys <= set(out["candidates"][0]) and keys <= set(out["recommended"])
    assert out["recommended"] == out["candidates"][0] and len(out["candidates"]) == len(advice.candidates)
    table = advice_table(advice, top=3)  # the first three, then each other strategy's best
    assert list(table.index[:3]) == [1, 2, 3] and set(table.plan.str.split(",").str[0]) == {
        c.spec.strategy for c in advice.candidates}
    assert len(table) == 3 + len({c.spec.strategy for c in advice.candidates} - {
        c.spec.strategy for c in advice.candidates[:3]})


def test_a_factory_model_is_planned_from_its_shapes():
    from examples import tiny_attention_lm as m

    base = base_spec("examples.tiny_attention_lm:mlx_factory", num_ranks=2, global_batch=8, seq_len=m.SEQ_LEN,
                     vocab_size=m.VOCAB_SIZE, framework="mlx")
    shapes = spec_from_flat([(p, s, "float32") for p, s in m.param_shapes().items()], "tiny_attention_lm")
    advice = advise_plan(base.model_factory, num_ranks=2, memory_bytes=1 * GiB, global_batch=8, seq_len=m.SEQ_LEN,
                         vocab_size=m.VOCAB_SIZE, runs_root="unused", links=LINKS, model_shapes=shapes,
                         profile=fake_profile(base))
    assert advice.recommended is not None and advice.recommended.spec.model_factory == base.model_factory
    with pytest.raises(ValueError, match="needs seq_len and vocab_size"):
        base_spec("examples.tiny_attention_lm:mlx_factory", num_ranks=2, global_batch=8, seq_len=None, framework="mlx")


@pytest.mark.parametrize("text, want", [("24GiB", 24 * GiB), ("512 MiB", 512 * MiB), ("1.5GiB", 3 * GiB // 2),
                                        ("4096", 4096), ("8KiB", 8 * KiB)])
def test_memory_takes_bytes_or_a_binary_unit(text, want):
    assert parse_memory(text) == want


@pytest.mark.parametrize("text", ["24GB", "lots", "-1GiB", "0", "0.5"])
def test_a_bad_memory_is_refused_naming_the_flag(text, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "lm", "--ranks", "2", "--memory", text])
    assert exit_.value.code == 2 and "argument --memory:" in capsys.readouterr().err


def test_a_bad_model_or_no_ranks_is_one_line_naming_it(capsys):
    assert main(["plan", "nope", "--ranks", "2", "--memory", "1GiB"]) == 2
    assert "MODEL 'nope'" in capsys.readouterr().err
    assert main(["plan", "lm", "--memory", "1GiB"]) == 2
    assert "--ranks" in capsys.readouterr().err


def test_review_puts_the_users_values_in_notebook_08s_parameter_cell_as_literals(tmp_path):
    import argparse
    import ast

    import nbformat

    from workbench.core.paths import NOTEBOOK_DIR
    from workbench.studies.planner.cli import add_plan_parser, review_parameters

    parser = argparse.ArgumentParser()
    add_plan_parser(parser.add_subparsers(dest="command"))
    model = tmp_path / "lm.json"
    model.write_text(json.dumps({**VALIDATION_MODEL, "dim": "__import__('os').system('touch pwned')"}))
    args = parser.parse_args(["review", str(model), "--ranks", "2", "--memory", "72MiB", "--runs", str(tmp_path)])
    cell = review_parameters(args)
    names = {}
    for node in ast.parse(cell).body:  # every line is NAME = literal: a user's text stays data
        names[node.targets[0].id] = ast.literal_eval(node.value)
    assert names["MODEL"]["dim"] == "__import__('os').system('touch pwned')" and names["MEMORY"] == 72 * MiB
    assert names["NUM_RANKS"] == 2 and names["RUNS"] == str(tmp_path.resolve()) and names["HOSTS"] is None
    nb = nbformat.read(NOTEBOOK_DIR / "08_plan_your_run.ipynb", as_version=4)
    mine = next(c.source for c in nb.cells if c.cell_type == "code" and c.source.startswith("MODEL = "))
    assigned = {getattr(t, "id", None) for n in ast.parse(mine).body for t in getattr(n.targets[0], "elts", n.targets)}
    assert assigned == set(names)  # the deck's cell sets what notebook 08's sets


def test_a_per_bucket_cost_is_priced_per_synced_bucket():
    base = base_spec(dict(VALIDATION_MODEL), num_ranks=2, global_batch=16, seq_len=None, framework="mlx")
    costly = advise_plan(dict(VALIDATION_MODEL), num_ranks=2, memory_bytes=4 * GiB, global_batch=16, runs_root="unused",
                         profile=fake_profile(base), links=LINKS, per_bucket_s=0.01)
    free = {c.label: c for c in advise(4 * GiB).candidates}
    for c in costly.candidates:
        if c.spec.strategy == "fsdp-row" and c.spec.num_microbatches == 1:
            buckets = plan_buckets(model_of(c.spec), c.spec.communication_size).num_buckets
            assert c.step.per_bucket_s == pytest.approx(0.01 * buckets) and free[c.label].step.per_bucket_s == 0


def test_the_validation_prints_the_notebooks_table_with_each_run_and_the_orders():
    from workbench.studies.planner.cli import format_validation
    from workbench.studies.planner.validate import Validated, Validation

    pick, runner = advise(2**40).candidates[:2]
    made = lambda c, role, step_s: Validated(candidate=c, role=role, run_id=f"run-{role}", status="done",  # noqa
                                             measured_step_s=step_s, measured_sync_s=None,
                                             measured_peak_bytes=int(c.predicted_peak_bytes * 1.25),
                                             peak_source="mx.get_peak_memory", off=("compute 25% over",))
    validation = Validation((made(pick, "pick", 2 * runner.predicted_step_s), made(runner, "runner-up", None)))
    text = format_validation(validation).splitlines()
    assert text[0].split()[:3] == ["role", "plan", "step"]
    pick_row = next(line for line in text if line.startswith("pick "))
    assert pick.label in pick_row and "+25%" in pick_row and "compute 25% over" in pick_row
    assert any(line.startswith("runner-up ") and " - " in line for line in text)  # no time measured: a dash
    assert "pick: done run-pick" in text and "runner-up: done run-runner-up" in text
    assert text[-1] == ("predicted order: pick, runner-up; measured: -; agree: None; pick measured fastest: None")


def test_across_hosts_a_hosts_ranks_share_its_cores_not_the_whole_runs():
    """On 2 hosts of one slot each, a rank has its host's cores: its compute is the profile's, not slowed as 2
    ranks sharing one machine would be (the rig, stop 40: 1,331 ms predicted where 709 ms was measured)."""
    from workbench.launch.hosts import parse_hosts
    from workbench.runs.estimate import predict_run_step_time

    base = base_spec(dict(VALIDATION_MODEL), num_ranks=2, global_batch=16, seq_len=None, framework="mlx")
    p = fake_profile(base)
    two_threads = profile_from_measurements({**p.to_dict(), "peak_rss_bytes": 1, "peak_array_bytes": 1, "cores": 2},
                                            profile_key_fields(base, 2), 1.0)  # 2 threads of 2 cores, measured alone
    hosts = parse_hosts({"hosts": [{"address": "10.0.0.11"}, {"address": "10.0.0.12"}]}, source="test")
    kw = dict(memory_bytes=4 * GiB, global_batch=16, runs_root="unused", profile=two_threads, links=LINKS)
    across = {c.label: c for c in advise_plan(dict(VALIDATION_MODEL), hosts=hosts, **kw).candidates}
    local = {c.label: c for c in advise_plan(dict(VALIDATION_MODEL), num_ranks=2, **kw).candidates}
    assert across.keys() == local.keys()
    for label, c in across.items():
        assert c.step.compute_s == pytest.approx(predict_run_step_time(c.spec, two_threads, LINKS,
                                                                       ranks_per_host=1).compute_s)
        assert local[label].step.compute_s > 1.5 * c.step.compute_s, label  # 4 threads on 2 cores, side by side


def test_across_hosts_the_profile_is_of_a_remote_rank_on_the_busiest_host(monkeypatch):
    """The advisor profiles as the launch runs: ranks fill host 0's slots first, and the busiest host's ranks share
    its cores; a rank on another host runs MLX's own BLAS (``remote_ranks``). The profiler is a spy here: the
    real one runs on the rig (test_multihost)."""
    from workbench.launch.hosts import parse_hosts
    from workbench.studies.planner import advise as advise_module

    asked = []

    def spy(spec, runs_root, **kw):
        asked.append(kw)
        return fake_profile(spec)

    monkeypatch.setattr(advise_module, "profile_model", spy)
    kw = dict(memory_bytes=4 * GiB, global_batch=16, runs_root="unused", links=LINKS)
    for slots, busiest in (((1, 3), 1), ((3, 1), 2)):
        hosts = parse_hosts({"hosts": [{"address": "10.0.0.11", "slots": slots[0]},
                                       {"address": "10.0.0.12", "slots": slots[1]}]}, source="test")
        advise_plan(dict(VALIDATION_MODEL), hosts=hosts, num_ranks=2, **kw)
        assert (asked[-1]["ranks_per_host"], asked[-1]["remote_ranks"]) == (busiest, True), slots
    advise_plan(dict(VALIDATION_MODEL), num_ranks=2, **kw)
    assert (asked[-1]["ranks_per_host"], asked[-1]["remote_ranks"]) == (2, False)


def test_a_repeat_says_whether_the_pick_is_faster_within_noise_or_slower():
    """Each validated plan is measured twice; the pick against the runner-up is 'within noise' where their steps
    differ by no more than the larger spread of either one's runs, else faster or slower; unsaid without a repeat."""
    from workbench.studies.planner.cli import format_validation
    from workbench.studies.planner.validate import Validated, Validation

    pick, runner = advise(2**40).candidates[:2]

    def made(c, role, *times):
        return Validated(candidate=c, role=role, run_id=f"{role}-0", status="done", measured_step_s=sum(times) / len(times),
                         measured_sync_s=None, measured_peak_bytes=c.predicted_peak_bytes, peak_source="mx.get_peak_memory",
                         repeat_step_s=times, repeat_run_ids=tuple(f"{role}-{i}" for i in range(len(times))))

    cases = [((0.100, 0.104), (0.110, 0.112), "faster"), ((0.100, 0.120), (0.108, 0.112), "within noise"),
             ((0.130, 0.131), (0.100, 0.101), "slower"), ((0.100,), (0.120,), None)]
    for mine, theirs, said in cases:
        validation = Validation((made(pick, "pick", *mine), made(runner, "runner-up", *theirs)))
        assert validation.pick_against_runner_up == said, (mine, theirs)
        assert validation.to_dict()["pick_against_runner_up"] == said
        assert validation.runs[0].noise_s == (pytest.approx(max(mine) - min(mine)) if len(mine) > 1 else None)
        text = format_validation(validation)
        assert (f"the pick against the runner-up, repeated: {said}" in text) == (said is not None)
        assert ("pick: done pick-0, pick-1" in text) == (len(mine) == 2)
    from workbench.studies.planner import validate_plan

    for bad in (0, True, 1.5):  # refused before anything runs
        with pytest.raises(ValueError, match=rf"repeats={bad!r}: a whole number >= 1"):
            validate_plan(advise(2**40), "never-made", repeats=bad)


def test_a_validated_plan_that_failed_is_shown_not_measured_never_within():
    from dataclasses import replace

    from workbench.studies.planner.tables import validation_table
    from workbench.studies.planner.validate import Validated, Validation

    pick = advise(2**40).candidates[0]
    done = Validated(candidate=pick, role="pick", run_id="run-pick", status="done", measured_step_s=pick.predicted_step_s,
                     measured_sync_s=None, measured_peak_bytes=pick.predicted_peak_bytes, peak_source="mx.get_peak_memory")
    failed = replace(done, status="failed", measured_step_s=None, measured_peak_bytes=None)
    assert validation_table(Validation((done,))).loc["pick", "off"] == "within 10%"
    assert validation_table(Validation((failed,))).loc["pick", "off"] == "not measured: failed"


def test_the_repeat_runs_the_plans_again_in_reverse_order_with_the_next_data_seed(tmp_path, monkeypatch):
    """What validate_plan asks the launcher to run, in order (the launcher replaced by a recorder whose runs all
    fail: a plan any of whose runs failed is shown unmeasured, never with one run's figures)."""
    from types import SimpleNamespace

    import workbench.studies.planner.validate as validate
    from workbench.studies.planner.validate import validate_plan, validation_plans

    asked = []

    def recorder(specs, root, **kwargs):
        asked.extend(specs)
        return [SimpleNamespace(status="failed") for _ in specs]

    monkeypatch.setattr(validate, "run_specs", recorder)
    advice = advise(2**40)
    plans = [c.spec for _, c in validation_plans(advice)]
    assert len(plans) >= 2
    check = validate_plan(advice, tmp_path, steps=3, repeats=3)
    seed = plans[0].data_seed
    assert asked == [replace(p, steps=3, data_seed=seed + r) for r, order in
                     ((0, plans), (1, plans[::-1]), (2, plans)) for p in order]
    assert all(v.status == "failed" and v.measured_step_s is None and v.measured_peak_bytes is None
               and v.repeat_step_s == (None,) * 3 for v in check.runs)
    assert check.pick_against_runner_up is None


def test_hsdp_is_priced_where_each_host_holds_an_equal_share_of_the_ranks():
    """JAX on 2 hosts of 2 slots: hsdp-row with a shard group per host, beside fsdp-row over all 4, its optimizer
    state twice fsdp-row's (sharded over 2, not 4), its step an all-reduce across the groups more. On one host, or
    hosts of unequal shares, it is not priced, and the advice says why; MLX does not run it."""
    from workbench.launch.hosts import parse_hosts, replica_groups

    assert (replica_groups((0, 0, 1, 1)), replica_groups((0, 0, 0, 1)), replica_groups((0, 1)),
            replica_groups((0, 0))) == (2, None, None, None)
    hosts = parse_hosts({"hosts": [{"address": "10.0.0.11", "slots": 2}, {"address": "10.0.0.12", "slots": 2}]},
                        source="test")
    kw = dict(memory_bytes=4 * GiB, global_batch=16, runs_root="unused", links=LINKS, framework="jax")
    base = base_spec(dict(VALIDATION_MODEL), num_ranks=4, global_batch=16, seq_len=None, framework="jax")
    advice = advise_plan(dict(VALIDATION_MODEL), hosts=hosts, profile=fake_profile(base), **kw)
    by = {(c.spec.strategy, c.spec.communication_size, c.spec.num_microbatches, c.spec.defer_sync): c
          for c in advice.candidates}
    hsdp = [c for c in advice.candidates if c.spec.strategy == "hsdp-row"]
    assert hsdp and {c.spec.num_replicas for c in hsdp} == {2} and "(2 replicas of 2)" in hsdp[0].label
    for c in hsdp:
        flat = by[("fsdp-row", c.spec.communication_size, c.spec.num_microbatches, c.spec.defer_sync)]
        assert c.step.comm_by_kind["all_reduce"] > 0 == flat.step.comm_by_kind.get("all_reduce", 0)
        assert c.to_dict()["num_replicas"] == 2 and c.predicted_peak_bytes > flat.predicted_peak_bytes
    assert any("hsdp-row: 2 replica groups of 2 ranks, one per host" in n for n in advice.notes), advice.notes
    assert "hsdp (shard within a host, replicate across) not priced: modelled only, no framework runs it" in advice.notes
    uneven = parse_hosts({"hosts": [{"address": "10.0.0.11", "slots": 3}, {"address": "10.0.0.12", "slots": 1}]},
                         source="test")
    for where, why in ((dict(hosts=uneven), "do not each hold the same number"), (dict(num_ranks=4), "one host")):
        other = advise_plan(dict(VALIDATION_MODEL), profile=fake_profile(base), **where, **kw)
        assert "hsdp-row" not in {c.spec.strategy for c in other.candidates}
        assert any(n.startswith("hsdp-row (shard within a host, replicate across) not priced: ") and why in n
                   for n in other.notes), other.notes
    mlx = advise_plan(dict(VALIDATION_MODEL), hosts=hosts, profile=fake_profile(replace(base, framework="mlx")),
                      **{**kw, "framework": "mlx"})
    assert "hsdp-row" not in {c.spec.strategy for c in mlx.candidates}
    assert "hsdp-row (shard within a host, replicate across) not priced: mlx does not run it" in mlx.notes, mlx.notes

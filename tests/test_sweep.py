"""The one sweep (workbench.launch.sweep.run_specs): runs specs in turn, skips those stored and done, goes on
after a failure, and reports progress events with an ETA; the display (views.progress) only watches it.

The loop is a one-process question: ``train`` here records into a real RunStore as the driver does (a done
spec is skipped, a failure is stored with its rank), without engines; real sweeps run in test_training."""

import json

from workbench.core.events import PROGRESS_ENV
from workbench.launch.driver import RunOutcome
from workbench.launch.sweep import SweepClock, all_done, run_specs
from workbench.runs.labels import run_label
from workbench.runs.spec import RunSpec
from workbench.runs.store import RunStore
from workbench.runs.tables import load_runs

SPECS = [RunSpec(num_ranks=n, steps=3, global_batch=8) for n in (1, 2, 4)]


def recording_train(calls: list):
    """A train function that stores like run_training: skip a done spec, else steps, then done or failed."""
    def train(spec, root, *, progress, **_):
        store = RunStore(root)
        if store.is_done(spec.to_dict()):
            return RunOutcome("", "skipped")
        calls.append(spec.num_ranks)
        handle = store.create(spec.to_dict(), {"backend": "ring"})
        for step in range(spec.steps):
            handle.append_steps([{"step": step, "rank": 0, "loss": 1.0, "grad_norm": 1.0, "step_time_s": 0.01}])
            progress(step + 1)
        if spec.num_ranks == 2 and handle.record.get("attempt", 1) == 1:  # fails the first time only
            handle.fail("RankError: out of memory", rank=1)
            return RunOutcome(handle.run_id, "failed", error="RankError: out of memory", rank=1, seconds=0.1)
        handle.finish({"final_loss": 1.0})
        return RunOutcome(handle.run_id, "done", seconds=0.1)
    return train


class Watcher:
    def __init__(self):
        self.seen = []

    def run_started(self, spec, label):
        self.seen.append(("start", label))
        return lambda done, eta_run, eta_sweep: self.seen.append(("steps", done, eta_run is not None))

    def run_ended(self, outcome):
        self.seen.append(("end", outcome.status))


def test_the_sweep_skips_done_specs_goes_on_after_a_failure_and_reports_each_run(tmp_path, monkeypatch):
    events = tmp_path / "events.jsonl"
    monkeypatch.setenv(PROGRESS_ENV, str(events))
    calls, watcher = [], Watcher()
    first = run_specs(SPECS, tmp_path / "runs", watcher=watcher, train=recording_train(calls))
    assert calls == [1, 2, 4] and [o.status for o in first] == ["done", "failed", "done"]
    assert not all_done(first)
    assert [s for s in watcher.seen if s[0] != "steps"] == [
        ("start", run_label(SPECS[0])), ("end", "done"), ("start", run_label(SPECS[1])), ("end", "failed"),
        ("start", run_label(SPECS[2])), ("end", "done")]
    assert ("steps", 3, True) in watcher.seen  # the display is given the steps done and an ETA once paced
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    assert [e["event"] for e in lines if e["event"] != "run_steps"] == ["run_start", "run_end"] * 3
    assert [e["status"] for e in lines if e["event"] == "run_end"] == ["done", "failed", "done"]
    last_steps = {e["index"]: e["done"] for e in lines if e["event"] == "run_steps"}  # each run's last report
    assert last_steps == {1: 3, 2: 3, 3: 3}

    calls.clear()
    second = run_specs(SPECS, tmp_path / "runs", train=recording_train(calls))
    assert calls == [2] and [o.status for o in second] == ["skipped", "done", "skipped"] and all_done(second)
    runs = load_runs(tmp_path / "runs").runs.set_index("spec.num_ranks")
    assert runs.loc[2, "attempt"] == 2 and runs.loc[1, "summary.final_loss"] == 1.0


def test_the_clock_paces_the_run_then_the_runs_left_at_the_trained_runs_mean():
    clock = SweepClock(3)
    clock.run_started()
    assert clock.eta(0, 10) == (None, None)  # no pace before a step
    clock.eta(1, 10)
    run_left, sweep_left = clock.eta(2, 10)
    assert run_left is not None and run_left >= 0 and sweep_left >= run_left
    clock.run_ended("done", 30.0)
    clock.run_ended("skipped", 0.0)  # a skipped run costs nothing
    clock.run_started()
    clock.eta(1, 10)
    run_left, sweep_left = clock.eta(10, 10)
    assert run_left == 0.0 and sweep_left == 30.0  # one run left, at the mean of the one trained (30 s)


def test_one_label_whatever_shape_the_run_comes_in(tmp_path):
    """A RunSpec, its dict and its row of load_runs (spec.* columns, integers as floats where a column has gaps)
    are labelled alike; what differs from the defaults is said."""
    import pandas as pd

    spec = RunSpec(strategy="fsdp-row", precision="bfloat16", communication_size=4 << 20, num_microbatches=2,
                   defer_sync=False, global_batch=8)
    row = pd.Series({f"spec.{k}": (float(v) if isinstance(v, int) and not isinstance(v, bool) else v)
                     for k, v in spec.to_dict().items() if k != "model"})
    assert run_label(spec) == run_label(spec.to_dict()) == run_label(row) == \
        "mlx fsdp-row bfloat16 communication_size 4.00 MiB G=2 every micro-batch"
    assert run_label(RunSpec(framework="jax")) == "jax ddp"



def test_a_label_names_what_sets_the_run_apart_among_those_shown():
    """Runs shown together are told apart by what differs among them (the bucket-size sweep by its sizes; the
    convergence runs, all at one size, by framework and strategy only), as the committed stores show."""
    from workbench.runs.labels import run_labels
    from workbench.studies.design_review import reference_runs_dir

    convergence = set(run_labels(load_runs(reference_runs_dir("convergence")).runs))
    assert "mlx fsdp-row" in convergence and not any("communication_size" in label for label in convergence)
    sizes = run_labels(load_runs(reference_runs_dir("comm-size")).runs)
    assert len(set(sizes)) == len(sizes) and all("communication_size" in label for label in sizes)
    alone = RunSpec(communication_size=4096)
    assert run_label(alone) == "mlx ddp communication_size 4.00 KiB"  # alone: what differs from the defaults
    assert run_label(alone, among=[alone, RunSpec(communication_size=4096, strategy="fsdp-row")]) == "mlx ddp"


def test_a_runs_bounds_and_its_placement_are_one_value_each_checked_where_made(tmp_path):
    """RunLimits bundles the three timeouts (each named when bad) and Placement the hosts and launcher (a bad
    launcher or hosts file is refused where it is made); run_training refuses both before any record exists."""
    import pytest

    from workbench.launch.driver import RunLimits, run_training
    from workbench.launch.remote import Placement

    assert RunLimits() == RunLimits(60.0, 180.0, 3600.0)
    for name in ("step_timeout_s", "startup_timeout_s", "timeout_s"):
        for bad in (0, -1.0, float("inf"), True, "60"):
            with pytest.raises(ValueError, match=f"{name}={bad!r}: must be a finite number of seconds > 0"):
                RunLimits(**{name: bad})
    here = Placement.of(None)
    assert here.hosts is None and here.record() is None and Placement.of(here) is here
    with pytest.raises(ValueError, match="launcher='rsh': choose one of"):
        Placement.of(tmp_path / "hosts.toml", "rsh")
    with pytest.raises(ValueError, match="timeout_s=0"):
        run_training(SPECS[0], tmp_path / "runs", timeout_s=0)
    with pytest.raises(ValueError, match="launcher='rsh'"):
        run_training(SPECS[0], tmp_path / "runs", hosts=tmp_path / "hosts.toml", launcher="rsh")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())

"""The run store under faults (issue 14): one writer per run, attempts never mixed, bad files reported."""

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap

import pytest

from workbench.runs.lock import RunLocked
from workbench.runs.store import RunStore, run_id_for
from workbench.runs.tables import load_runs, read_steps

SPEC = {"framework": "mlx", "strategy": "fsdp", "num_ranks": 2}


def rows(steps, rank=0):
    return [{"step": s, "rank": rank, "loss": 1.0 / (s + 1), "grad_norm": 0.5, "step_time_s": 0.01} for s in steps]


def start_owner(root, spec):
    """A second real process that creates the run, writes a step, says so, then holds the run."""
    code = textwrap.dedent(f"""
        import sys, time
        from workbench.runs.store import RunStore
        handle = RunStore({str(root)!r}).create({spec!r})
        handle.append_steps([dict(step=0, rank=0, loss=1.0, grad_norm=1.0, step_time_s=0.1)])
        print("owner ready", flush=True)
        time.sleep(300)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "owner ready"
    return proc


def test_a_second_writer_is_refused_naming_the_run_and_the_owner(tmp_path):
    owner = start_owner(tmp_path, SPEC)
    try:
        with pytest.raises(RunLocked, match=rf"Run '{run_id_for(SPEC)}' is already being written by process {owner.pid}"):
            RunStore(tmp_path).create(SPEC)
        loaded = load_runs(tmp_path)
        assert loaded.runs.status.tolist() == ["running"] and len(loaded.steps) == 1  # nothing written twice
    finally:
        owner.kill()
        owner.wait()


def test_a_run_whose_owner_died_is_marked_failed_and_redone_in_a_fresh_attempt(tmp_path):
    owner = start_owner(tmp_path, SPEC)
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    handle = RunStore(tmp_path).create(SPEC)  # the kernel released the dead owner's lock
    assert handle.recovered.startswith("driver died") and f"process {owner.pid}" in handle.recovered
    assert handle.record["attempt"] == 2 and handle.record["owner"]["pid"] == os.getpid()
    old = json.loads((handle.folder / "attempts" / "1" / "record.json").read_text())
    assert old["status"] == "failed" and old["error"] == handle.recovered
    assert len((handle.folder / "attempts" / "1" / "steps.jsonl").read_text().splitlines()) == 1
    handle.append_steps(rows(range(2)))
    handle.finish()
    loaded = load_runs(tmp_path)
    assert loaded.problems == [] and loaded.runs.attempt.tolist() == [2]
    assert loaded.steps.step.tolist() == [0, 1] and set(loaded.steps.attempt) == {2}


def test_rows_a_stray_writer_of_an_earlier_attempt_appends_are_never_read(tmp_path):
    store = RunStore(tmp_path)
    first = store.create(SPEC)
    stray = store.open(first.run_id)  # an engine of attempt 1 (as orphans were, in issue 14)
    first.fail("stopped")
    second = store.create(SPEC)
    second.append_steps(rows(range(3)))
    stray.append_steps(rows(range(874, 877)))  # lands in attempt 2's file
    loaded = load_runs(tmp_path)
    assert loaded.steps.step.tolist() == [0, 1, 2] and set(loaded.steps.attempt) == {2}
    assert len(loaded.problems) == 1 and "3 rows of attempt(s) [1] skipped" in loaded.problems[0][1]
    assert [r["step"] for r in read_steps(second.folder / "steps.jsonl")] == [0, 1, 2]  # newest attempt


def test_record_and_steps_are_created_with_the_same_permissions(tmp_path):
    handle = RunStore(tmp_path).create(SPEC)
    handle.append_steps(rows(range(1)))
    modes = {name: stat.S_IMODE((handle.folder / name).stat().st_mode) for name in ("record.json", "steps.jsonl")}
    assert modes == {"record.json": 0o644, "steps.jsonl": 0o644}


def write_run(root, name, record=None, steps=()):
    folder = root / name
    folder.mkdir()
    from workbench.runs.spec import RunSpec

    record = {"run_id": name, "spec": RunSpec().to_dict(), "status": "done"} if record is None else record
    (folder / "record.json").write_text(record if isinstance(record, str) else json.dumps(record))
    (folder / "steps.jsonl").write_text("".join(s + "\n" for s in steps))


GOOD_STEP = json.dumps(rows([0])[0])
BAD_RECORDS = {
    "deep": "[" * 100_000,
    "run-id-int": {"run_id": 5, "spec": {"framework": "mlx"}, "status": "done"},
    "status-list": {"run_id": "status-list", "spec": {"framework": "mlx"}, "status": ["done"]},
    "spec-text": {"run_id": "spec-text", "spec": "x", "status": "done"},
    "other-folder": {"run_id": "not-my-folder", "spec": {"framework": "mlx"}, "status": "done"},
    "framework-int": {"run_id": "framework-int", "spec": {"framework": 3}, "status": "done"},
}


def test_load_runs_reports_every_ill_typed_record_and_row_and_loads_the_rest(tmp_path):
    from workbench.studies.memory import memory_validation
    from workbench.studies.runs import summarize_runs

    for name, record in BAD_RECORDS.items():
        write_run(tmp_path, name, record, [GOOD_STEP])
    bad_steps = ["[" * 100_000, json.dumps({**rows([1])[0], "loss": "x"}), json.dumps({**rows([2])[0], "step": 2.5}),
                 json.dumps({**rows([3])[0], "rank": True})]
    write_run(tmp_path, "good", steps=[GOOD_STEP, *bad_steps, json.dumps(rows([4])[0])])
    loaded = load_runs(tmp_path)
    assert loaded.runs.run_id.tolist() == ["good"] and loaded.steps.step.tolist() == [0, 4]
    reasons = {os.path.basename(os.path.dirname(p)) + ("/steps" if p.endswith("jsonl") else ""): r
               for p, r in loaded.problems if not p.endswith("jsonl")}
    assert set(reasons) == set(BAD_RECORDS)
    assert "nested deeper than 64 levels" in reasons["deep"] and "run_id is 5" in reasons["run-id-int"]
    assert "status is ['done']" in reasons["status-list"] and "spec is 'x'" in reasons["spec-text"]
    assert "not its folder's name" in reasons["other-folder"] and "spec.framework is 3" in reasons["framework-int"]
    step_reasons = [r for p, r in loaded.problems if p.endswith("jsonl")]
    assert len(step_reasons) == 4 and "nested deeper" in step_reasons[0] and "loss is 'x'" in step_reasons[1]
    assert "step is 2.5" in step_reasons[2] and "rank is True" in step_reasons[3]
    summarize_runs(loaded)  # no KeyError: what reaches the tables has the shape they index into
    memory_validation(loaded)


def test_is_done_survives_a_record_nested_too_deep(tmp_path):
    store = RunStore(tmp_path)
    folder = tmp_path / run_id_for(SPEC)
    folder.mkdir()
    (folder / "record.json").write_text("[" * 100_000)
    assert store.is_done(SPEC) is False
    assert store.create(SPEC).record["attempt"] == 2  # the unreadable record is set aside as attempt 1, not fatal
    assert (folder / "attempts" / "1" / "record.json").read_text() == "[" * 100_000

"""Run records on real files: round trip, crash tolerance, atomic records, sweeps, concurrent appends."""

import json
import math
import multiprocessing
import os

import numpy as np
import pytest

from workbench.runs.store import RunStore, run_id_for
from workbench.runs.tables import load_runs

SPEC = {"framework": "mlx", "strategy": "fsdp", "model": "tiny", "num_ranks": 2, "bucket_bytes": 2**20}
META = {"versions": {"mlx": "0.32.0", "numpy": "2.4"}, "backend": "ring", "collective_path": "all_gather",
        "estimate": {"peak_memory_bytes": 123456}}


def rows(steps, rank=0, **extra):
    return [{"step": s, "rank": rank, "loss": 2.0 / (s + 1), "grad_norm": 1.0, "step_time_s": 0.01, **extra}
            for s in steps]


def test_round_trip(tmp_path):
    store = RunStore(tmp_path)
    handle = store.create(SPEC, META)
    assert handle.status == "running" and store.list_runs() == [handle.run_id]
    assert not store.is_done(SPEC)
    handle.append_steps(rows(range(3), peak_memory_bytes=np.int64(1000)))
    handle.append_steps(rows(range(3), rank=1, note="x"))
    handle.append_steps([{**rows([3])[0], "loss": np.float32("nan")}])
    handle.finish({"final_loss": 0.5, "mean_step_time_s": 0.01})
    assert store.is_done(SPEC)

    result = load_runs(tmp_path)
    assert result.problems == []
    run = result.runs.iloc[0]
    assert run["run_id"] == handle.run_id == run_id_for(SPEC)
    assert run["status"] == "done" and run["error"] is None and run["attempt"] == 1
    assert run["spec.strategy"] == "fsdp" and run["spec.num_ranks"] == 2
    assert run["backend"] == "ring" and run["versions.mlx"] == "0.32.0"
    assert run["estimate.peak_memory_bytes"] == 123456 and run["summary.final_loss"] == 0.5
    steps = result.steps
    assert len(steps) == 7 and set(steps["run_id"]) == {handle.run_id}
    assert sorted(steps.groupby("rank").size()) == [3, 4]
    assert steps["peak_memory_bytes"].dropna().tolist() == [1000] * 3
    assert steps["note"].dropna().tolist() == ["x"] * 3
    assert math.isnan(steps.loc[steps["step"] == 3, "loss"].iloc[0])  # NaN stored as null


def test_truncated_last_step_line_keeps_complete_lines(tmp_path):
    handle = RunStore(tmp_path).create(SPEC, META)
    handle.append_steps(rows(range(5)))
    with open(handle.folder / "steps.jsonl", "ab") as f:  # a crash in the middle of step 5
        f.write(b'{"step": 5, "rank": 0, "loss": 0.3')
    result = load_runs(tmp_path)
    assert result.steps["step"].tolist() == [0, 1, 2, 3, 4]
    assert len(result.problems) == 1
    path, reason = result.problems[0]
    assert path.endswith("steps.jsonl") and "truncated last line 6" in reason
    assert result.runs["status"].tolist() == ["running"]


def test_corrupt_middle_line_is_reported_and_skipped(tmp_path):
    handle = RunStore(tmp_path).create(SPEC, META)
    handle.append_steps(rows([0]))
    with open(handle.folder / "steps.jsonl", "ab") as f:
        f.write(b"garbage\n[1, 2]\n")
    handle.append_steps(rows([1]))
    result = load_runs(tmp_path)
    assert result.steps["step"].tolist() == [0, 1]
    assert [r.split(" ")[:3] for _, r in result.problems] == [["unreadable", "line", "2"], ["unreadable", "line", "3"]]


def test_record_write_is_atomic_and_leftover_temp_file_is_ignored(tmp_path):
    store = RunStore(tmp_path)
    handle = store.create(SPEC, META)
    handle.finish({"final_loss": 1.0})
    assert sorted(p.name for p in handle.folder.iterdir()) == [".lock", "record.json"]  # no temp left behind
    # A crash between writing the temp file and os.replace leaves a half-written temp file.
    (handle.folder / ".record.json.abc123.tmp").write_text('{"run_id": "x", "sta')
    result = load_runs(tmp_path)
    assert result.problems == [] and result.runs["status"].tolist() == ["done"]
    assert store.is_done(SPEC) and store.list_runs() == [handle.run_id]


def test_corrupt_record_is_reported_and_the_others_load(tmp_path):
    store = RunStore(tmp_path)
    good = store.create(SPEC, META)
    good.append_steps(rows(range(2)))
    good.finish({})
    bad = store.create({**SPEC, "strategy": "ddp"}, META)
    bad.append_steps(rows(range(4)))
    text = (bad.folder / "record.json").read_text()
    (bad.folder / "record.json").write_text(text[: len(text) // 2])  # truncated record
    (tmp_path / "not-a-run").mkdir()
    (tmp_path / "stray.txt").write_text("ignored")
    listed = store.create({**SPEC, "strategy": "list"}, META)
    (listed.folder / "record.json").write_text("[1, 2]")

    result = load_runs(tmp_path)
    assert result.runs["run_id"].tolist() == [good.run_id]
    assert set(result.steps["run_id"]) == {good.run_id} and len(result.steps) == 2
    reasons = {os.path.basename(os.path.dirname(p)): r for p, r in result.problems}
    assert set(reasons) == {bad.run_id, listed.run_id, "not-a-run"}
    assert "unreadable" in reasons[bad.run_id] and "missing" in reasons["not-a-run"]
    assert not store.is_done({**SPEC, "strategy": "ddp"})


def test_empty_root_loads_empty_frames(tmp_path):
    assert load_runs(tmp_path).problems == []  # an empty store is fine
    result = load_runs(tmp_path / "nothing-here")  # a mistyped one is reported (issue 14, item 8)
    assert len(result.runs) == 0 and len(result.steps) == 0
    assert result.problems == [(str(tmp_path / "nothing-here"), "no such folder")]
    assert {"run_id", "step", "loss"} <= set(result.steps.columns)
    assert RunStore(tmp_path / "nothing-here").list_runs() == []


def test_run_ids_are_stable_readable_and_distinct():
    reordered = dict(reversed(list(SPEC.items())))
    assert run_id_for(SPEC) == run_id_for(reordered) == run_id_for(json.loads(json.dumps(SPEC)))
    assert run_id_for(SPEC).startswith("mlx-fsdp-") and len(run_id_for(SPEC)) == len("mlx-fsdp-") + 12
    variants = [SPEC, {**SPEC, "num_ranks": 4}, {**SPEC, "strategy": "ddp"}, {**SPEC, "extra": None}]
    assert len({run_id_for(s) for s in variants}) == len(variants)
    assert run_id_for({"model": "tiny"}).startswith("run-")
    assert run_id_for({"framework": "jax/cpu", "x": 1}).startswith("jax_cpu-")
    with pytest.raises(ValueError, match="spec"):
        run_id_for({"x": object()})


def test_refuses_to_overwrite_a_done_run(tmp_path):
    store = RunStore(tmp_path)
    first = store.create(SPEC, META)
    first.append_steps(rows(range(3)))
    first.finish({"final_loss": 1.0})
    with pytest.raises(FileExistsError, match="overwrite=True"):
        store.create(SPEC, META)
    assert load_runs(tmp_path).runs["summary.final_loss"].tolist() == [1.0]
    again = store.create(SPEC, META, overwrite=True)
    assert again.status == "running" and again.record["attempt"] == 2
    assert len(load_runs(tmp_path).steps) == 0  # a restart starts with no steps
    with pytest.raises(ValueError, match="status"):
        store.create(SPEC, {"status": "done"})


def test_fail_keeps_steps_and_names_the_rank(tmp_path):
    store = RunStore(tmp_path)
    handle = store.create(SPEC, META)
    handle.append_steps(rows(range(2), rank=1))
    handle.fail("RuntimeError: NCCL timeout", rank=1)
    result = load_runs(tmp_path)
    run = result.runs.iloc[0]
    assert run["status"] == "failed" and run["failed_rank"] == 1 and "timeout" in run["error"]
    assert len(result.steps) == 2
    # A failed run is not done: creating it again restarts it without overwrite=True.
    assert store.create(SPEC, META).record["attempt"] == 2
    with pytest.raises(ValueError, match="loss"):
        handle.append_steps([{"step": 0, "rank": 0}])


def _append_worker(root, run_id, rank, num_steps):
    handle = RunStore(root).open(run_id)
    pad = str(rank) * 4000  # long lines make any mid-line interleaving visible
    for start in range(0, num_steps, 10):
        handle.append_steps(rows(range(start, min(start + 10, num_steps)), rank=rank, pad=pad))


def test_concurrent_appends_from_two_processes_never_interleave(tmp_path):
    handle = RunStore(tmp_path).create(SPEC, META)
    num_steps = 300
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_worker, args=(str(tmp_path), handle.run_id, r, num_steps)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    lines = (handle.folder / "steps.jsonl").read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 2 * num_steps + 1
    for line in lines[:-1]:
        row = json.loads(line)
        assert row["pad"] == str(row["rank"]) * 4000
    result = load_runs(tmp_path)
    assert result.problems == []
    for rank in (0, 1):
        assert sorted(result.steps.loc[result.steps["rank"] == rank, "step"]) == list(range(num_steps))

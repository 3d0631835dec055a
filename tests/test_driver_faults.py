"""A training run under faults of its driver (issue 14), on real engines and real processes:
the driver killed mid-run takes everything it started with it, a second driver of the same run is
refused at once, and the next call marks the dead attempt failed and redoes it cleanly."""

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from workbench.launch.cluster_files import cluster_profile_dir
from workbench.launch.driver import run_training
from workbench.runs.lock import RunLocked
from workbench.runs.spec import RunSpec
from workbench.runs.tables import load_runs

#: A run long enough to be killed mid-way (tens of ms a step with 2 ranks on 2 cores), short enough to redo.
SPEC = dict(framework="mlx", strategy="ddp", num_ranks=2, steps=60, global_batch=4)

DRIVER = textwrap.dedent("""
    import json, sys
    from workbench.launch.driver import run_training
    from workbench.runs.spec import RunSpec
    run_training(RunSpec(**json.loads(sys.argv[2])), sys.argv[1])
""")


def alive(pids):
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def start_driver(root, spec):
    """``run_training`` in a process of its own; returns it once both ranks have stored a step."""
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(root), json.dumps(spec)])
    steps = None
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and driver.poll() is None:
        steps = next(Path(root).glob("*/steps.jsonl"), None)
        if steps is not None and len(steps.read_bytes().splitlines()) >= 4:
            return driver
        time.sleep(0.05)
    driver.kill()
    pytest.fail(f"the driver stored no steps within 180 s (exit code {driver.poll()})")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_driver_takes_engines_and_controller_with_it_and_the_next_call_redoes_the_run(tmp_path, sig):
    spec = RunSpec(**SPEC)
    driver = start_driver(tmp_path, SPEC)
    started = psutil.Process(driver.pid).children(recursive=True)  # controller (+children), engines, nannies
    names = " ".join(" ".join(p.cmdline()) for p in started)
    assert "ipyparallel.controller" in names and "ipyparallel.engine" in names, names

    t0 = time.monotonic()  # a second driver of the same run is refused at once, naming the first
    with pytest.raises(RunLocked, match=rf"already being written by process {driver.pid} on "):
        run_training(spec, tmp_path)
    assert time.monotonic() - t0 < 5

    security = cluster_profile_dir() / "security"  # the workbench's own profile folder
    cluster_files = list(security.glob(f"cluster-workbench-{driver.pid}-*.json"))
    assert len(cluster_files) == 1
    os.kill(driver.pid, sig)
    killed_at = time.monotonic()
    driver.wait()
    pids = [p.pid for p in started]
    while alive(pids) and time.monotonic() - killed_at < 10:
        time.sleep(0.05)
    gone_s = time.monotonic() - killed_at
    print(f"{signal.Signals(sig).name}: {len(pids)} processes gone {gone_s:.2f} s after the driver")
    orphans = {p: " ".join(psutil.Process(p).cmdline()) for p in alive(pids)}
    for pid in orphans:  # the test's own leftovers, should the fix be absent
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL) if os.getpgid(pid) == pid else os.kill(pid, signal.SIGKILL)
    assert orphans == {}
    assert not cluster_files[0].exists()

    steps_file = next(tmp_path.glob("*/steps.jsonl"))
    size = steps_file.stat().st_size
    time.sleep(1)
    assert steps_file.stat().st_size == size  # nothing trains on
    outcome = run_training(spec, tmp_path)
    assert outcome.status == "done", outcome.error
    assert outcome.recovered.startswith("driver died") and f"process {driver.pid}" in outcome.recovered
    loaded = load_runs(tmp_path)
    assert loaded.problems == [] and loaded.runs.attempt.tolist() == [2] and loaded.runs.status.tolist() == ["done"]
    pairs = list(zip(loaded.steps.step, loaded.steps["rank"]))
    assert sorted(pairs) == [(s, r) for s in range(SPEC["steps"]) for r in (0, 1)]  # each (step, rank) once
    first = json.loads((steps_file.parent / "attempts" / "1" / "record.json").read_text())
    assert first["status"] == "failed" and first["error"] == outcome.recovered


def test_a_stale_cluster_file_is_removed_by_the_next_start(tmp_path):
    """A driver killed before its reaper could act leaves ``cluster-workbench-*.json`` marked running."""
    from workbench.launch.engines import remove_stale_cluster_files, start_engines
    from workbench.launch.plan import plan_launch

    with start_engines(plan_launch(1, framework="jax")) as run:
        cluster_file = Path(run.cluster.cluster_file)
        controller = run.cluster.controller.pid
        os.killpg(controller, signal.SIGKILL)  # the controller is gone, its file says "running"
        with contextlib.suppress(psutil.NoSuchProcess):  # already reaped (seen once): gone, as the wait wants
            psutil.Process(controller).wait(10)
        assert json.loads(cluster_file.read_text())["controller"]["state"]["state"] == "running"
        live = tmp_path / "cluster-workbench-live.json"  # a live controller's file stays
        live.write_text(json.dumps({"controller": {"state": {"pid": os.getpid()}}}))
        removed = remove_stale_cluster_files(cluster_file.parent)
        assert cluster_file in removed and not cluster_file.exists()


def test_run_training_knobs_are_refused_before_anything_starts_naming_the_knob(tmp_path):
    spec = RunSpec(**{**SPEC, "steps": 2})
    bad = [({"timeout_s": "600"}, "timeout_s='600'"), ({"step_timeout_s": math.nan}, "step_timeout_s=nan"),
           ({"step_timeout_s": 0}, "step_timeout_s=0"), ({"step_timeout_s": -1}, "step_timeout_s=-1"),
           ({"startup_timeout_s": math.inf}, "startup_timeout_s=inf"), ({"timeout_s": True}, "timeout_s=True"),
           ({"progress": 3}, "progress=3")]
    for kw, name in bad:
        with pytest.raises(ValueError, match=name.replace("(", r"\(")):
            run_training(spec, tmp_path, **kw)
    with pytest.raises(ValueError, match="runs_root=''"):
        run_training(spec, "")
    with pytest.raises(ValueError, match=r"spec must be a RunSpec, got dict \(build one with RunSpec\(\*\*spec\)\)"):
        run_training(SPEC, tmp_path)
    assert list(tmp_path.iterdir()) == [] and not any(Path.cwd().glob("mlx-ddp-*"))


def test_a_one_rank_mlx_run_needs_no_distributed_backend(tmp_path):
    t0 = time.monotonic()
    outcomes = [run_training(RunSpec(framework="mlx", strategy=s, num_ranks=1, steps=3, global_batch=4), tmp_path)
                for s in ("ddp", "fsdp-row")]
    assert [o.status for o in outcomes] == ["done", "done"], [o.error for o in outcomes]
    assert time.monotonic() - t0 < 60  # the ring of one waited 30 s for a peer, then failed
    loaded = load_runs(tmp_path)
    assert len(loaded.steps) == 2 * 3 and set(loaded.runs.backend) == {"none"}
    assert {r["backend"] for ranks in loaded.runs["summary.ranks"] for r in ranks} == {"none"}


def test_a_done_run_is_redone_with_skip_done_false_keeping_the_done_attempt(tmp_path):
    spec = RunSpec(**{**SPEC, "steps": 2})
    first = run_training(spec, tmp_path)
    assert first.status == "done" and run_training(spec, tmp_path).status == "skipped"
    again = run_training(spec, tmp_path, skip_done=False)
    assert again.status == "done" and again.run_id == first.run_id
    loaded = load_runs(tmp_path)
    assert loaded.runs.attempt.tolist() == [2] and len(loaded.steps) == 2 * 2
    assert (tmp_path / first.run_id / "attempts" / "1" / "steps.jsonl").is_file()

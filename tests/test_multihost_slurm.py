"""Engines started through ipyparallel's Slurm launcher on the multi-host rig's own Slurm cluster
(``python scripts/hosts_rig up --slurm``: munged, a slurmctld on the head, one slurmd per host).

A 2-host MLX run submitted as one ``sbatch`` job must end on the loss of the same spec on one host and
name each rank's host; tearing the rig down must leave no Slurm or munge daemon, also when its state is
lost. Skipped, with the reason, where the rig cannot be built or Slurm cannot run here (slurm-wlm or
munge missing, or a daemon that does not start: the skip quotes its log).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

pytest.register_assert_rewrite("rig")
from rig import ROOT, hosts_rig, rig_or_skip

from workbench.launch.driver import run_training
from workbench.launch.hosts import load_hosts
from workbench.runs.spec import RunSpec
from workbench.runs.tables import load_runs

pytest_plugins = ["rig"]

TINY = {"vocab_size": 32, "seq_len": 16, "dim": 32, "num_layers": 1, "num_heads": 2, "mlp_dim": 64}
T = 60


def _spec(**kw) -> RunSpec:
    return RunSpec(**{"framework": "mlx", "num_ranks": 2, "steps": 4, "global_batch": 8, "model": TINY, **kw})


def _losses(root, run_id):
    steps = load_runs(root).steps
    rows = steps[steps.run_id == run_id]
    return rows.groupby("step").loss.mean().to_numpy(), rows


def _running(pid) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _daemon_pids(slurm: dict) -> list[int]:
    return [slurm["munged_pid"], slurm["slurmctld_pid"], *slurm["slurmd_pids"].values()]


def _pgrep(pattern: str) -> list[str]:
    """Live processes whose command line matches (a killed daemon left a zombie has none)."""
    out = subprocess.run(["pgrep", "-a", "-f", pattern], capture_output=True, text=True, timeout=T, check=False).stdout
    return [line for line in out.splitlines() if line.split()[0] != str(os.getpid())]


def _assert_no_slurm_left(slurm: dict) -> None:
    assert not [p for p in _daemon_pids(slurm) if _running(p)], "a munged, slurmctld or slurmd is still running"
    assert _pgrep(slurm["dir"] + "/") == []


def test_a_run_through_slurm_across_hosts_ends_on_the_one_host_loss(tmp_path, monkeypatch):
    t0 = time.monotonic()
    with rig_or_skip(2, slurm=True) as rig:
        slurm = rig["slurm"]
        assert slurm["nodes"] == [h["name"] for h in rig["hosts"]] and Path(slurm["conf"]).is_file()
        assert all(_running(p) for p in _daemon_pids(slurm))
        listening = subprocess.run(["ss", "-H", "-l", "-t", "-n"], capture_output=True, text=True, timeout=T, check=False).stdout
        assert f"{rig['head_address']}:{slurm['port']}" in listening.split()  # slurmctld on the head's address only
        assert f"0.0.0.0:{slurm['port']}" not in listening.split()
        for key, value in slurm["env"].items():  # sbatch and scancel, run by ipyparallel, find the rig's cluster
            monkeypatch.setenv(key, value)
        hosts = load_hosts(Path(rig["state_dir"]) / "rig.json")
        reference = run_training(_spec(strategy="fsdp-row"), tmp_path / "one-host")
        assert reference.status == "done", reference.error
        monkeypatch.chdir(tmp_path)  # sbatch's default output would land here
        outcome = run_training(_spec(strategy="fsdp-row"), tmp_path / "slurm", hosts=hosts, launcher="slurm",
                               startup_timeout_s=60)
        assert outcome.status == "done", outcome.error
        curve, rows = _losses(tmp_path / "slurm", outcome.run_id)
        assert sorted(zip(rows.step, rows["rank"])) == [(s, r) for s in range(4) for r in range(2)]
        np.testing.assert_allclose(curve, _losses(tmp_path / "one-host", reference.run_id)[0], rtol=1e-5)
        record = load_runs(tmp_path / "slurm").runs.set_index("run_id").loc[outcome.run_id]
        placements = [r["placement"] for r in record["summary.ranks"]]
        assert [p["host"] for p in placements] == slurm["nodes"]
        assert [p["hostname"] for p in placements] == [h["hostname"] for h in rig["hosts"]]
        assert [p["address"] for p in placements] == [h["address"] for h in rig["hosts"]]
        assert not list(tmp_path.glob("slurm-*.out"))
        squeue = subprocess.run(["squeue", "-h", "-t", "PD,CF,R"], capture_output=True, text=True, timeout=T, check=False)
        assert squeue.returncode == 0 and squeue.stdout.strip() == "", squeue.stdout  # cancelled (at most completing)
    _assert_no_slurm_left(slurm)
    assert not Path(slurm["dir"]).exists()
    assert time.monotonic() - t0 < 90


CRASHING_UP = textwrap.dedent("""
    import json, os, signal, sys
    sys.path.insert(0, sys.argv[1])
    import hosts_rig
    try:
        desc = hosts_rig.up(2, sys.argv[2], prefix=sys.argv[3], slurm=True)
    except hosts_rig.RigUnavailable as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(desc), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # no teardown at all
""")


def test_down_by_prefix_stops_slurm_and_munge_when_the_state_is_lost():
    prefix = "wbs" + secrets.token_hex(2)
    # A short folder, not tmp_path: munged's socket path must stay under the kernel's 108 bytes, and pytest-xdist's
    # worker folders (popen-gw0/) took tmp_path past it (munged refused to start and the test was skipped).
    short = Path(tempfile.mkdtemp(prefix="wbs-", dir="/tmp"))
    state = short / "state"
    proc = subprocess.run([sys.executable, "-c", CRASHING_UP, str(ROOT / "scripts"), str(state), prefix],
                          check=False, capture_output=True, text=True, timeout=T)
    if proc.returncode == 2:
        reason = proc.stderr.strip().splitlines()[-1]
        pytest.skip(("Slurm on the multi-host rig cannot run here: " if reason.startswith("SlurmUnavailable")
                     else "multi-host rig cannot be built here: ") + reason.split(": ", 1)[1])
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    slurm = json.loads(proc.stdout)["slurm"]
    try:
        assert all(_running(p) for p in _daemon_pids(slurm))  # the crash left them: there is work for down
        shutil.rmtree(state)
        out = subprocess.run([sys.executable, str(ROOT / "scripts" / "hosts_rig"), "down", "--prefix", prefix],
                             check=False, capture_output=True, text=True, timeout=T)
        assert out.returncode == 0, out.stderr
        _assert_no_slurm_left(slurm)
    finally:
        hosts_rig.down(prefix=prefix)
        shutil.rmtree(short, ignore_errors=True)


def test_missing_slurm_is_a_skip_naming_the_packages(monkeypatch):
    real = hosts_rig.slurm._tool
    monkeypatch.setattr(hosts_rig.slurm, "_tool", lambda name, env=None: None if name in ("slurmctld", "munged") else real(name, env))
    with pytest.raises(hosts_rig.SlurmUnavailable,
                       match=r"needs slurmctld, munged \(apt-get install -y munge slurm-wlm slurmctld\)"):
        hosts_rig.check_slurm_support()
    with pytest.raises(pytest.skip.Exception, match="cannot"), rig_or_skip(2, slurm=True):
        pass  # not reached: a skip, either this one (Slurm) or the rig's own reason

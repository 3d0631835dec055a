"""The workbench's ipyparallel clusters live in a profile folder of their own (issue 29, item 9).

A JupyterLab running beside a build lists, through its ipyparallel server extension, every cluster file of
every ``$IPYTHONDIR/profile_*`` folder, adopts the clusters it finds and deletes their log files when they
stop: notebook 06's stored output once read "Failed to remove ...ipcontroller...log". Here a real JupyterLab
(127.0.0.1, a free port, its own folders) asks for its clusters, as its cluster panel does, while a real
engines cluster of the workbench runs beside it.
"""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import pytest

from lab_server import running_jupyterlab


@pytest.fixture
def lab_and_ipython_dir(tmp_path, monkeypatch):
    """A JupyterLab with ipyparallel's extension on ``$IPYTHONDIR`` = a fresh folder, which this process uses too."""
    ipython_dir, home = tmp_path / "ipython", tmp_path / "lab"
    home.mkdir()
    (ipython_dir / "profile_default").mkdir(parents=True)  # a user's default profile, as JupyterLab finds it
    monkeypatch.setenv("IPYTHONDIR", str(ipython_dir))
    token = os.urandom(8).hex()
    with running_jupyterlab(tmp_path, home, token=token, env={"IPYTHONDIR": str(ipython_dir)}) as url:
        def get(path: str):
            req = urllib.request.Request(f"{url}{path}", headers={"Authorization": f"token {token}"})
            return json.load(urllib.request.urlopen(req, timeout=30))

        yield get, ipython_dir


def _ours(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*")) if folder.is_dir() else []


def test_a_jupyterlab_beside_a_run_never_sees_or_touches_its_cluster(lab_and_ipython_dir, caplog):
    from workbench.launch.engines import cluster_profile_dir, rank_identity, start_engines
    from workbench.launch.plan import plan_launch

    get, ipython_dir = lab_and_ipython_dir
    assert [c["cluster"]["cluster_id"] for c in get("/ipyparallel/clusters")] == [""]  # the extension answers
    default = ipython_dir / "profile_default"
    with start_engines(plan_launch(2, framework="mlx"), timeout_s=120) as run:
        cluster_id, profile = run.cluster.cluster_id, Path(run.cluster.profile_dir)
        assert profile == cluster_profile_dir() and ipython_dir not in profile.parents
        listed = [c["cluster"]["cluster_id"] for c in get("/ipyparallel/clusters")]  # what JupyterLab's cluster panel asks
        assert cluster_id not in listed, f"JupyterLab adopted the run's cluster: {listed}"
        assert sorted(r for r, _, _ in run.apply(rank_identity, [(), ()], timeout_s=60)) == [0, 1]
        assert (profile / "security" / f"cluster-{cluster_id}.json").is_file()
        logs = sorted((profile / "log").glob(f"ip*{cluster_id}*.log"))
        assert len(logs) >= 3, logs  # the controller's and each engine's log, in our folder, intact
        assert all(p.stat().st_size > 0 for p in logs if p.name.startswith("ipengine"))
        assert [c["cluster"]["cluster_id"] for c in get("/ipyparallel/clusters")] == listed
    after = [c["cluster"]["cluster_id"] for c in get("/ipyparallel/clusters")]
    assert cluster_id not in after
    # Nothing of the run in the default profile (its engine logs once piled up there: 1,896 files), and
    # nothing of it left in its own folder either.
    assert not [n for n in _ours(default / "security") + _ours(default / "log") if "workbench" in n or "ipengine" in n]
    assert not [p.name for p in profile.rglob(f"*{cluster_id}*")]
    assert "Failed to remove" not in caplog.text


def test_the_next_start_sweeps_the_files_a_killed_run_left_and_only_those(tmp_path):
    from workbench.launch.cluster_files import remove_stale_cluster_files

    security, log = tmp_path / "security", tmp_path / "log"
    security.mkdir()
    log.mkdir()
    gone, alive = "workbench-2147483646-0badc0de", f"workbench-{os.getpid()}-00c0ffee"  # no such pid; this one
    left = [security / f"ipcontroller-{gone}-client.json", security / f"ipcontroller-{gone}-engine.json",
            log / f"ipcontroller-{gone}-7.log", log / f"ipengine-{gone}-1795704183-0.log", log / f"engines{gone}.json"]
    kept = [security / f"ipcontroller-{alive}-client.json", log / f"ipengine-{alive}-1795704183-0.log",
            security / "ipcontroller-client.json", log / "ipengine-1795721161.3721.out",  # not ours
            log / "ipengine-workbench-remote-18a2b-0.log"]  # ours, but its driver cannot be told from its id
    for path in left + kept:
        path.write_text("{}")
    assert sorted(remove_stale_cluster_files(security)) == sorted(left)
    assert all(p.exists() for p in kept) and not any(p.exists() for p in left)

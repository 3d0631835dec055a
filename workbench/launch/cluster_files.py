"""Where the workbench's ipyparallel clusters keep their files, and the sweep of files a dead run left (issue 29).

A cluster's files (``security/cluster-<id>.json``, the controller's connection files, the controller's and
engines' logs) live in an IPython profile folder of the workbench's own (:func:`cluster_profile_dir`), never
in ``$IPYTHONDIR``: a JupyterLab running beside a build lists every cluster of ``$IPYTHONDIR/profile_*``
through its ipyparallel extension, adopts it, and deleted the build's logs while its runs read them.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

#: Prefix of the ipyparallel cluster ids (and so ``cluster-<id>.json`` files) :mod:`workbench.launch.engines`
#: starts: ``workbench-<driver pid>-<random hex>``.
CLUSTER_PREFIX = "workbench-"


def cluster_profile_dir() -> Path:
    """The clusters' IPython profile folder: ``$WORKBENCH_CLUSTER_DIR``, else ``~/.cache/workbench/ipyparallel``
    (remote hosts use the same path under their home folder)."""
    return Path(os.environ.get("WORKBENCH_CLUSTER_DIR") or Path.home() / ".cache" / "workbench" / "ipyparallel")


def remove_stale_cluster_files(security_dir: Path) -> list[Path]:
    """Remove the files of this module's clusters that no process runs any more.

    A driver killed before its reaper could act (or before it registered the controller) leaves its
    cluster file marked running, and a killed run leaves its connection files and logs: the next start
    removes a ``cluster-workbench-*.json`` whose controller is gone, then every connection file and log of
    a ``workbench-<pid>-*`` cluster that has no cluster file and whose driver ``pid`` is gone. Files of
    other clusters are left alone.

    Args:
        security_dir: The profile's ``security`` folder (its ``log`` folder is beside it).

    Returns:
        The files removed.
    """
    import psutil

    security_dir, removed = Path(security_dir), []
    for path in sorted(security_dir.glob(f"cluster-{CLUSTER_PREFIX}*.json")):
        try:
            pid = json.loads(path.read_text())["controller"]["state"]["pid"]
            alive = psutil.pid_exists(pid) and "ipyparallel" in " ".join(psutil.Process(pid).cmdline())
        except (OSError, ValueError, KeyError, TypeError, psutil.Error):
            alive = False  # unreadable, or its controller vanished while we looked
        if not alive:
            path.unlink(missing_ok=True)
            removed.append(path)
    owned = re.compile(rf"{CLUSTER_PREFIX}(\d+)-([0-9a-f]+)")
    for path in sorted([*security_dir.glob(f"ipcontroller-{CLUSTER_PREFIX}*"), *security_dir.parent.glob(f"log/*{CLUSTER_PREFIX}*")]):
        m = owned.search(path.name)
        if m and not (security_dir / f"cluster-{m[0]}.json").exists() and not psutil.pid_exists(int(m[1])):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed

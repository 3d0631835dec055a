"""The same runs across a cluster's hosts (issue 16): notebook 04 repeats its sweep on the hosts of a
hosts file when one is present (:attr:`workbench.publish.notebook.NotebookSettings.hosts`), and says
so in one line when there is none."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from workbench.launch.driver import RunOutcome
from workbench.runs.spec import RunSpec
from workbench.runs.tables import load_runs
from workbench.views.progress import run_sweep

#: What a notebook shows where no hosts file is given.
NO_HOSTS = ("No hosts file ($WORKBENCH_HOSTS, or notebooks/hosts.toml): every run here is on this machine. "
            "With one, this cell repeats them across its hosts (see the README, 'Running on your cluster').")


def run_across_hosts(specs: Iterable[RunSpec], runs_root: Path | str, hosts: Path | str | None, *,
                     launcher: str = "ssh", **run_kwargs) -> tuple[list[RunOutcome], object] | None:
    """Run ``specs`` on the hosts of ``hosts`` into ``runs_root`` and load them back, or print
    :data:`NO_HOSTS` and return None when ``hosts`` is None.

    Returns:
        ``(outcomes, loaded)``: one :class:`RunOutcome` per spec, and :func:`load_runs` of ``runs_root``
        (every rank's host is in its record, under ``summary.ranks[*].placement``).
    """
    if hosts is None:
        print(NO_HOSTS)
        return None
    outcomes = run_sweep(specs, runs_root, hosts=hosts, launcher=launcher, **run_kwargs)
    return outcomes, load_runs(runs_root)

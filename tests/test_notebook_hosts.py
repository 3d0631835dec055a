"""A notebook's cross-host cells: the hosts file comes from $WORKBENCH_HOSTS or notebooks/hosts.toml."""

import pytest

from workbench.publish.notebook import HOSTS_ENV, LAUNCHER_ENV, NotebookSettings
from workbench.studies.hosts import NO_HOSTS, run_across_hosts

SETTINGS = NotebookSettings(export=False, small=True, renderer="json")


def test_the_hosts_file_is_named_by_the_environment_or_absent(tmp_path, monkeypatch):
    from workbench.core import paths

    monkeypatch.delenv(HOSTS_ENV, raising=False)
    monkeypatch.delenv(LAUNCHER_ENV, raising=False)
    expected = paths.NOTEBOOK_DIR / "hosts.toml"
    assert SETTINGS.hosts == (expected if expected.is_file() else None)
    assert SETTINGS.launcher == "ssh"
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('[[hosts]]\naddress = "198.18.0.11"\n')
    monkeypatch.setenv(HOSTS_ENV, str(hosts))
    monkeypatch.setenv(LAUNCHER_ENV, "mpi")
    assert SETTINGS.hosts == hosts and SETTINGS.launcher == "mpi"
    monkeypatch.setenv(HOSTS_ENV, str(tmp_path / "missing.toml"))
    with pytest.raises(ValueError, match=r"\$WORKBENCH_HOSTS=.*missing.toml.*no such hosts file"):
        SETTINGS.hosts


def test_without_a_hosts_file_nothing_runs_and_the_notebook_says_so(tmp_path, capsys):
    assert run_across_hosts([], tmp_path / "runs", None) is None
    assert capsys.readouterr().out.strip() == NO_HOSTS
    assert not (tmp_path / "runs").exists()

"""Nothing in a hosts file runs as code (issue 24, items 1-2): the launchers' own scripts and command
lines, built by the code that builds them for a run, executed for real, create no marker file.

Each payload is refused where the hosts file is read (test_hosts_input.py). Here it is smuggled past
that check into a :class:`Host` (as a missed check would let it through), to show that what the
launchers are told still keeps it a literal: ipyparallel's Slurm launcher writes its batch script and
``sh`` runs it; ipyparallel's ssh launcher runs the real ssh client; OpenMPI's ``plm_rsh_args``
never takes a word with whitespace. On the multi-host rig (scripts/hosts_rig) the whole start,
:func:`start_remote_engines`, runs each payload against real sshds and ``mpiexec``.
"""

from __future__ import annotations

import shlex
import socket
import stat
import subprocess
from pathlib import Path

import pytest

pytest.register_assert_rewrite("rig")
from rig import rig_or_skip

from workbench.launch.engines import EngineFailure
from workbench.launch.hosts import Host, HostsFile, load_hosts, plan_hosts_launch
from workbench.launch.remote import slurm_template, start_remote_engines

pytest_plugins = ["rig"]  # multihost_rig: one rig per session, shared with the other rig tests


def smuggle(host: Host, **fields) -> Host:
    """``host`` with ``fields`` set past its checks: what the launchers make of a value a check let through."""
    for key, value in fields.items():
        object.__setattr__(host, key, value)
    return host


def two_hosts(framework="mlx", **fields) -> object:
    first = smuggle(Host(address="10.0.0.11", python="/opt/py/bin/python"), **fields)
    hosts = HostsFile(hosts=(first, Host(address="10.0.0.12", python="/opt/py/bin/python")))
    return plan_hosts_launch(hosts, framework=framework, ports=[20001, 20002] if framework == "mlx" else [20001])


# ------------------------------------------------------------------------------------------ Slurm


def write_and_run_batch_script(plan, tmp_path) -> tuple[str, list[str]]:
    """ipyparallel's Slurm launcher, set up as :func:`start_remote_engines` sets it up, writes its batch
    script; ``sh`` runs it with an ``srun`` that records its arguments. Returns the script and srun's argv."""
    from ipyparallel.cluster.launcher import SlurmEngineSetLauncher

    launcher = SlurmEngineSetLauncher(work_dir=str(tmp_path), profile_dir=str(tmp_path / "profile"), cluster_id="c1",
                                      batch_file_name=str(tmp_path / "slurm_engine.sbatch"),
                                      batch_template=slurm_template(plan),
                                      engine_cmd=[plan.hosts[0].python, "-m", "workbench.launch.engine_env"])
    launcher.write_batch_script(plan.num_ranks)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(f'#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done > {tmp_path}/srun.argv\n')
    (bin_dir / "srun").chmod(stat.S_IRWXU)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    subprocess.run(["sh", launcher.batch_file], env=env, cwd=tmp_path, timeout=30, check=True)
    return Path(launcher.batch_file).read_text(), (tmp_path / "srun.argv").read_text().splitlines()


def test_the_slurm_batch_script_runs_only_srun_with_the_engine_command(tmp_path):
    plan = two_hosts(name="gpu-01")
    script, argv = write_and_run_batch_script(plan, tmp_path)
    lines = script.splitlines()
    assert lines[:5] == ["#!/bin/sh", "#SBATCH --ntasks=2", "#SBATCH --nodes=2", "#SBATCH --nodelist=gpu-01,10.0.0.12",
                         "#SBATCH --ntasks-per-node=1"]
    assert [line for line in lines if not line.startswith("#")] == [lines[-1]] and lines[-1].startswith("srun ")
    assert argv[:4] == ["--distribution=block", "/opt/py/bin/python", "-m", "workbench.launch.engine_env"]


def test_slurm_settings_become_sbatch_lines_and_cannot_add_any(tmp_path):
    from workbench.launch.remote_cmd import slurm_template as template

    settings = {"queue": "gpu", "account": "ml", "timelimit": "1:00:00", "exclusive": True}
    script = template(two_hosts(), settings=settings)
    assert "#SBATCH --partition=gpu\n#SBATCH --account=ml\n#SBATCH --time=1:00:00\n" in script
    with pytest.raises(ValueError, match=r"slurm queue='gpu\\n#SBATCH --uid=0': contains a control character"):
        template(two_hosts(), settings={"queue": "gpu\n#SBATCH --uid=0"})


@pytest.mark.parametrize("payload", [
    "{__import__('pathlib').Path('MARKER').touch()}",  # ipyparallel's EvalFormatter evaluates it
    "h1\ntouch MARKER\n#",  # a line of the script
    "{__import__('os').system('touch MARKER')}",
])
def test_a_host_name_never_runs_in_the_slurm_batch_script(tmp_path, payload):
    marker = tmp_path / "pwned"
    plan = two_hosts(name=payload.replace("MARKER", str(marker)))
    with pytest.raises(ValueError, match=r"Slurm node name=.* \(host 10.0.0.11\): contains"):
        write_and_run_batch_script(plan, tmp_path)
    assert not marker.exists()


def test_a_python_path_is_one_word_of_the_slurm_batch_script(tmp_path):
    marker = tmp_path / "pwned"
    plan = two_hosts()
    for h in plan.hosts:
        smuggle(h, python=f"python3; touch {marker}")
    _, argv = write_and_run_batch_script(plan, tmp_path)
    assert argv[1] == f"python3; touch {marker}" and not marker.exists()


def test_braces_in_a_template_literal_stay_literal():
    from IPython.utils.text import EvalFormatter

    from workbench.launch.remote_cmd import _literal

    payload = "{__import__('os').getpid()}"
    assert EvalFormatter().format(_literal(payload) + " {n}", n=2) == payload + " 2"


# ------------------------------------------------------------------------------------------ ssh, locally


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when this returns: ssh's connect is refused, nothing leaves


def test_an_ssh_user_is_never_an_ssh_option(tmp_path):
    """ipyparallel's ssh launcher, set up by :func:`ssh_engine_settings`, runs the real ssh client."""
    from ipyparallel.cluster.launcher import SSHEngineSetLauncher

    from workbench.launch.remote_cmd import ssh_engine_settings, ssh_options

    marker = tmp_path / "pwned"
    plan = two_hosts(user=f"-oProxyCommand=touch {marker};", python=f"python3; touch {marker} #")
    smuggle(plan.hosts[0], address="127.0.0.1", port=closed_port())
    settings = ssh_engine_settings(plan, 0, ssh_options(None, 1))
    launcher = SSHEngineSetLauncher(work_dir=str(tmp_path), profile_dir=str(tmp_path / "profile"), cluster_id="c1",
                                    **settings)
    with pytest.raises(Exception, match="Unable to get remote shell information"):  # ssh ran, and failed to connect
        launcher.start(1)
    engine = next(iter(launcher.launchers.values()))
    assert engine.location == "127.0.0.1" and engine.ssh_args[-4:-2] == ["-o", f"User=-oProxyCommand=touch {marker};"]
    # ssh hands remote_python and its arguments to the host's login shell as one string, joined by spaces
    words = shlex.split(" ".join([engine.remote_python, "-m", "IPython"]))
    assert words == [f"python3; touch {marker} #", "-m", "IPython"]
    assert engine.program[0] == f"python3; touch {marker} #"  # run there without a shell (ipyparallel's Popen)
    assert not marker.exists()


# ------------------------------------------------------------------------------------------ mpiexec


def test_no_word_of_plm_rsh_args_carries_whitespace_or_another_option(tmp_path):
    from workbench.launch.remote_cmd import mpi_args, ssh_options

    plan = two_hosts(framework="jax", user="me")
    smuggle(plan.hosts[1], user="me")
    args = mpi_args(plan, "10.0.0.1", tmp_path, ssh_options("/etc/ssh/cfg", 5))
    assert args[args.index("plm_rsh_args") + 1] == ("-F /etc/ssh/cfg -o BatchMode=yes -o ConnectTimeout=5 -o "
                                                     "ServerAliveInterval=5 -o ServerAliveCountMax=3 -l me -p 22")
    with pytest.raises(ValueError, match=r"^ssh_config='/my cluster/cfg': launcher='mpi' .* splits on whitespace"):
        mpi_args(plan, "10.0.0.1", tmp_path, ssh_options("/my cluster/cfg", 5))
    for h in plan.hosts:
        smuggle(h, user=f"me -oProxyCommand=touch$IFS{tmp_path}/pwned")
    with pytest.raises(ValueError, match=r"^user='me -oProxyCommand"):
        mpi_args(plan, "10.0.0.1", tmp_path, ssh_options(None, 5))
    smuggle(plan.hosts[1], user="other")
    with pytest.raises(ValueError, match=r"same ssh user and port; the hosts' differ \(users \['me -oProxy.*'other'\]"):
        mpi_args(plan, "10.0.0.1", tmp_path, ssh_options(None, 5))
    named = plan_hosts_launch(HostsFile(hosts=(Host(address="10.0.0.11"), Host(address="node2"))), framework="jax")
    with pytest.raises(ValueError, match=r"launcher='mpi' needs each host's IPv4 address .* host node2"):
        mpi_args(named, "10.0.0.1", tmp_path, ssh_options(None, 5))


# ------------------------------------------------------------------------------------------ on the rig


def rig_plan(rig, framework="jax", **fields):
    hf = load_hosts(Path(rig["state_dir"]) / "rig.json", slots=1)
    hosts = tuple(smuggle(Host(**h.__dict__), **fields) for h in hf.hosts)
    return hf, plan_hosts_launch(HostsFile(hosts=hosts), framework=framework)


@pytest.mark.parametrize("launcher, field, payload", [
    ("ssh", "user", "-oProxyCommand=touch MARKER;"),
    ("ssh", "python", "python3; touch MARKER #"),
    ("mpi", "ssh_config", "CONFIG -oProxyCommand=touch$IFSMARKER"),
    ("mpi", "user", "root -oProxyCommand=touch$IFSMARKER"),
    ("slurm", "name", "{__import__('pathlib').Path('MARKER').touch()}"),
    ("slurm", "name", "h2\ntouch MARKER\n#"),
])
def test_a_payload_runs_nowhere_when_engines_start_across_hosts(multihost_rig, tmp_path, monkeypatch, launcher, field,
                                                              payload):
    """:func:`start_remote_engines` as a run calls it: real sshds, mpiexec, ipyparallel's launchers."""
    marker = tmp_path / "pwned"
    hf, plan = rig_plan(multihost_rig, "mlx" if launcher == "slurm" else "jax")
    value = payload.replace("$IFSMARKER", f"$IFS{marker}").replace("MARKER", str(marker))
    value = value.replace("CONFIG", hf.ssh_config)
    if field != "ssh_config":
        hf, plan = rig_plan(multihost_rig, "mlx" if launcher == "slurm" else "jax", **{field: value})
    config = value if field == "ssh_config" else hf.ssh_config
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-slurm.conf"))  # sbatch and sinfo, if reached, find no cluster
    with pytest.raises((EngineFailure, ValueError)) as info:
        with start_remote_engines(plan, launcher=launcher, controller_ip=hf.controller_ip, ssh_config=config,
                                  timeout_s=60, workdir=tmp_path / "work"):
            pass
    assert not marker.exists(), info.value
    if launcher != "ssh":  # refused before anything started
        assert isinstance(info.value, ValueError) and (field in str(info.value) or "Slurm node name" in str(info.value))


def test_slurm_names_the_host_whose_node_cannot_take_the_job(tmp_path, monkeypatch):
    """Slurm's reachability check (the ssh launchers probe each sshd): sinfo's state of every host's node."""
    from workbench.launch.remote_cmd import check_slurm_nodes

    with rig_or_skip(2, slurm=True) as rig:
        for key, value in rig["slurm"]["env"].items():
            monkeypatch.setenv(key, value)
        hosts = load_hosts(Path(rig["state_dir"]) / "rig.json").hosts
        check_slurm_nodes(["h1", "h2"], hosts, timeout_s=30)
        with pytest.raises(EngineFailure, match=r"^host h2 \(.*\): Slurm node 'gpu-9' is not a node of this cluster "
                                                r"\(sinfo lists h1, h2\)$"):
            check_slurm_nodes(["h1", "gpu-9"], hosts, timeout_s=30)
        subprocess.run(["scontrol", "update", "nodename=h2", "state=drain", "reason=issue-24-test"], check=True,
                       timeout=30, capture_output=True)
        with pytest.raises(EngineFailure, match=r"^host h2 \(.*\): Slurm node 'h2' is 'drain' \(sinfo\)$"):
            check_slurm_nodes(["h1", "h2"], hosts, timeout_s=30)

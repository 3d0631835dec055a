"""Slurm on the rig (``up --slurm``): a munged with the rig's own key, a slurmctld on the head and one
slurmd per host, all under ``<state>/<rig id>-slurm/``, and finding those daemons again to stop them."""

from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import subprocess
import time
from pathlib import Path

from .errors import SlurmUnavailable
from .net import _free_port
from .procs import _alive, _cmdline, _descendants, _pids, _read_pid, _run, _tool
from .state import _current_user, _save

SLURM_TOOLS = {"slurmctld": "slurmctld", "slurmd": "slurmd", "sinfo": "slurm-client", "sbatch": "slurm-client",
               "srun": "slurm-client", "scancel": "slurm-client", "munged": "munge", "unshare": "util-linux",
               "mount": "mount", "hostname": "hostname"}


def check_slurm_support() -> dict[str, str]:
    """The tools Slurm on the rig uses, by name; raise SlurmUnavailable naming the missing ones and their packages."""
    tools = {name: _tool(name) for name in SLURM_TOOLS}
    missing = [name for name, path in tools.items() if path is None]
    if missing:
        pkgs = sorted({SLURM_TOOLS[m] for m in missing} | ({"slurm-wlm"} if {"slurmctld", "slurmd"} & set(missing) else set()))
        raise SlurmUnavailable(f"Slurm on the rig needs {', '.join(missing)} (apt-get install -y {' '.join(pkgs)})")
    return tools


def _plan_slurm(rig_id: str, state_dir: Path, hosts: list[dict]) -> dict:
    sdir = state_dir / f"{rig_id}-slurm"  # the rig id in every daemon's command line: `down --prefix` finds them
    conf = sdir / "slurm.conf"
    return {
        "dir": str(sdir),
        "conf": str(conf),
        "env": {"SLURM_CONF": str(conf)},  # what sbatch, srun, sinfo, scancel need to find this cluster
        "controller": f"{rig_id}-head",
        "partition": "rig",
        "nodes": [h["name"] for h in hosts],  # the Slurm node of host i is named as the host: h1, h2, ...
        "munge_key": str(sdir / "munge.key"),
        "munge_socket": str(sdir / "munge.socket"),
        "munged_pid": None,
        "slurmctld_pid": None,
        "slurmd_pids": {h["name"]: None for h in hosts},
        "slurmctld_log": str(sdir / "slurmctld.log"),
        "munged_log": str(sdir / "munged.log"),
    }


#: CPUs each rig node declares: more than the machine may have (``config_overrides``), so a job may place
#: several ranks per host on a small machine. The rig proves placement, not resource enforcement.
SLURM_NODE_CPUS = 16


_HEAD_WRAPPER = 'mount=$1 hosts=$2 name=$3; shift 3; "$mount" --bind "$hosts" /etc/hosts && hostname "$name" && exec "$@"'


def _slurm_conf(desc: dict, port: int) -> str:
    sl, sdir = desc["slurm"], Path(desc["slurm"]["dir"])
    cpus = max(SLURM_NODE_CPUS, os.cpu_count() or 1)
    nodes = [f"NodeName={h['name']} NodeAddr={h['address']}" + (f" NodeHostname={h['hostname']}" if desc["uts"] else "")
             + f" CPUs={cpus} State=UNKNOWN" for h in desc["hosts"]]
    return "\n".join([
        f"# Slurm of multi-host rig {desc['rig_id']} (scripts/hosts_rig up --slurm); clients: SLURM_CONF={sl['conf']}",
        f"ClusterName={desc['rig_id']}",
        # the controller's own hostname (its UTS namespace) and the head's address; with NoCtldInAddrAny it
        # listens only there, as that name resolves to the head's address in its mount namespace's /etc/hosts
        f"SlurmctldHost={sl['controller']}({desc['head_address']})",
        f"SlurmctldPort={port}",
        "SlurmdPort=6818",  # each slurmd in its own network namespace
        "CommunicationParameters=NoCtldInAddrAny",
        f"SlurmUser={_current_user()}",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={sl['munge_socket']}",
        f"StateSaveLocation={sdir / 'ctld'}",
        f"SlurmctldPidFile={sdir / 'slurmctld.pid'}",
        f"SlurmctldLogFile={sl['slurmctld_log']}",
        f"SlurmdSpoolDir={sdir / 'spool' / '%n'}",
        f"SlurmdPidFile={sdir / 'spool' / '%n.pid'}",
        f"SlurmdLogFile={sdir / 'spool' / '%n.log'}",
        f"PlugStackConfig={sdir / 'plugstack.conf'}",  # not /etc/slurm's
        "ProctrackType=proctrack/linuxproc",  # no cgroups: a host is a network namespace, not a cgroup tree
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SchedulerType=sched/builtin",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SlurmdParameters=config_overrides",
        "MpiDefault=none",
        "MailProg=/bin/true",
        "ReturnToService=2",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=30",
        "InactiveLimit=0",
        "KillWait=2",
        "MinJobAge=30",
        *nodes,
        f"PartitionName={sl['partition']} Nodes={','.join(sl['nodes'])} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES",
    ]) + "\n"


def _start_daemon(cmd: list[str], log: Path, what: str, own_log) -> None:
    start = log.stat().st_size if log.exists() else 0
    with open(log, "a") as out:
        proc = _run(cmd, check=False, stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        said = " | ".join(x for x in (log.read_text(errors="replace")[start:].strip()[-600:], _errors(own_log)) if x)
        raise SlurmUnavailable(f"{what} did not start: `{shlex.join(cmd)}` exited {proc.returncode}: {said or 'no message'}")


def _errors(path, n: int = 3) -> str:
    """The last ``n`` error lines of a daemon's log, or its tail."""
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    bad = [line for line in lines if re.search(r"error|fatal|fail", line, re.IGNORECASE)]
    return " | ".join((bad or lines)[-n:]).strip()


def _start_slurm(desc: dict, tools: dict, timeout: float) -> None:
    """munged, slurmctld on the head and one slurmd per host; returns once every node is idle."""
    sl = desc["slurm"]
    sdir = Path(sl["dir"])
    shutil.rmtree(sdir, ignore_errors=True)
    for d in [sdir / "ctld"] + [sdir / "spool" / node for node in sl["nodes"]]:
        d.mkdir(parents=True, mode=0o700)
    key = Path(sl["munge_key"])
    key.write_bytes(secrets.token_bytes(1024))  # the rig's own munge key, never /etc/munge's
    key.chmod(0o400)
    port = _free_port(desc["head_address"])
    sl["port"] = port
    Path(sl["conf"]).write_text(_slurm_conf(desc, port))
    (sdir / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")  # autodetect fails where /sys/fs/cgroup has no cgroup fs
    (sdir / "plugstack.conf").write_text("")
    hosts_file = sdir / "hosts"
    hosts_file.write_text("\n".join(["127.0.0.1\tlocalhost", f"{desc['head_address']}\t{sl['controller']}"]
                                    + [f"{h['address']}\t{h['hostname']}" for h in desc["hosts"] if desc["uts"]]) + "\n")
    start_log = sdir / "start.log"
    # munged refuses a socket whose parent directories others cannot traverse (the state is 0700); --force
    # runs it anyway: only root (the rig's user) talks to it
    _start_daemon([tools["munged"], "--force", f"--key-file={key}", f"--socket={sl['munge_socket']}",
                   f"--pid-file={sdir / 'munged.pid'}", f"--log-file={sl['munged_log']}", f"--seed-file={sdir / 'munged.seed'}"],
                  start_log, "munged", sl["munged_log"])
    sl["munged_pid"] = _read_pid(sdir / "munged.pid")
    _save(desc)
    _start_daemon([tools["unshare"], "--mount", "--uts", "--propagation", "private", tools["sh"], "-c", _HEAD_WRAPPER, "sh",
                   tools["mount"], str(hosts_file), sl["controller"], tools["slurmctld"], "-f", sl["conf"]],
                  start_log, "slurmctld", sl["slurmctld_log"])
    for h in desc["hosts"]:
        cmd = [tools["ip"], "netns", "exec", h["netns"]]
        if desc["uts"]:
            cmd += [tools["unshare"], "--uts", tools["sh"], "-c", 'hostname "$0" && exec "$@"', h["hostname"]]
        _start_daemon(cmd + [tools["slurmd"], "-f", sl["conf"], "-N", h["name"]], start_log, f"slurmd of {h['name']}",
                      sdir / "spool" / f"{h['name']}.log")
    env = dict(os.environ, **sl["env"])
    deadline = time.monotonic() + timeout
    states: dict[str, str] = {}
    while True:
        sl["slurmctld_pid"] = sl["slurmctld_pid"] or _read_pid(sdir / "slurmctld.pid")
        for node in sl["nodes"]:
            sl["slurmd_pids"][node] = sl["slurmd_pids"][node] or _read_pid(sdir / "spool" / f"{node}.pid")
        _save(desc)
        daemons = [("munged", sl["munged_pid"], sl["munged_log"]), ("slurmctld", sl["slurmctld_pid"], sl["slurmctld_log"])]
        daemons += [(f"slurmd of {n}", sl["slurmd_pids"][n], sdir / "spool" / f"{n}.log") for n in sl["nodes"]]
        for what, pid, log in daemons:
            if pid is not None and not _alive(pid):
                raise SlurmUnavailable(f"{what} (pid {pid}) exited: {_errors(log)}")
        if sl["slurmctld_pid"]:
            proc = _run([tools["sinfo"], "-h", "-N", "-o", "%N %t"], check=False, env=env)
            states = dict(line.split()[:2] for line in proc.stdout.splitlines() if len(line.split()) >= 2)
            if proc.returncode == 0 and all(states.get(n) == "idle" for n in sl["nodes"]) and all(p for _, p, _ in daemons):
                return
        if time.monotonic() > deadline:
            logs = "; ".join(f"{what}: {_errors(log)}" for what, _, log in daemons)
            raise SlurmUnavailable(f"the Slurm nodes were not idle within {timeout:g} s (sinfo: {states or 'no answer'}); {logs}")
        time.sleep(0.1)


def _slurm_pids(marker: re.Pattern | str) -> set[int]:
    """The rig's Slurm and munge daemons, by their command line (every one names a file in the rig's Slurm
    directory), and what they started."""
    if isinstance(marker, str):
        marker = re.compile(re.escape(marker))
    return _descendants({pid for pid in _pids() if pid != os.getpid() and marker.search(_cmdline(pid))})

"""What the remote launchers are told: ssh options and each ssh engine's settings, the engines' shared
environment, OpenMPI's arguments and hostfile, the Slurm batch template, and reachability checks that
name the host that does not answer (its sshd; for Slurm, its node's state).

Every host value reaching them was checked (:mod:`workbench.launch.host_values`); here they are also
placed so that none can become an option or a shell word: the ssh user goes as ``-o User=<user>`` (one
argument, never ``user@host``), the remote Python is quoted for the remote login shell, nothing with
whitespace enters OpenMPI's space-split ``plm_rsh_args``, and every literal in the batch template has
its braces escaped from ipyparallel's ``EvalFormatter``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shlex
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from workbench.launch.engines import EngineFailure
from workbench.launch.host_values import NAME, check_text
from workbench.launch.hosts import Host, MultiHostPlan
from workbench.launch.local_run import OMPI_THREAD_MULTIPLE

#: The module engines run on the hosts (it becomes ``ipyparallel.engine``).
ENGINE_MODULE = "workbench.launch.engine_env"


def ssh_options(ssh_config: str | None, connect_timeout_s: float) -> list[str]:
    """ssh's arguments: never a prompt (a launcher has no terminal), bounded connects, dead links noticed."""
    args = ["-F", ssh_config] if ssh_config else []
    return args + ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, round(connect_timeout_s))}",
                   "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"]


def ssh_engine_settings(plan: MultiHostPlan, rank: int, ssh_args: list[str]) -> dict:
    """Settings of ipyparallel's ``SSHEngineSetLauncher`` that start ``rank``'s engine on its host.

    ssh gets the user as ``-o User=<user>`` (one argument: a value can never be read as an option, as
    ``<user>@host`` could), and the remote Python quoted (a backstop: :data:`PYTHON` admits no shell
    syntax and no ``NAME=value`` word), since ssh hands ``remote_python`` to the
    host's login shell as a command string; the engine command itself runs there without a shell.
    """
    h = plan.host_of(rank)
    user = ["-o", f"User={h.user}"] if h.user else []
    return dict(ssh_args=list(ssh_args) + user, scp_args=list(ssh_args) + user, remote_python=shlex.quote(h.python),
                engine_cmd=[h.python, "-m", ENGINE_MODULE],
                engines={f"{h.address}:{h.port}": {"n": 1, "to_send": []}})  # the key goes by environment


def engine_env(plan: MultiHostPlan, grace_s: float = 10.0) -> dict[str, str]:
    """The environment every engine of ``plan`` gets; :mod:`workbench.launch.engine_env` picks its rank's part."""
    envs = [dict(e) for e in plan.rank_env]
    env = {"WORKBENCH_RANK_ENVS": json.dumps(envs), "WORKBENCH_CONTROLLER_GRACE_S": f"{grace_s:g}"}
    if plan.hostfile is not None:
        env["WORKBENCH_MLX_HOSTFILE_JSON"] = json.dumps(plan.hostfile)
    return env


def openmpi_hostfile(plan: MultiHostPlan) -> str:
    """OpenMPI's hostfile: each host that carries ranks, with as many slots as it carries."""
    counts = {}
    for r in range(plan.num_ranks):
        h = plan.host_of(r)
        counts[h.address] = counts.get(h.address, 0) + 1
    return "".join(f"{address} slots={n}\n" for address, n in counts.items())


def rsh_args(words: list[str]) -> str:
    """OpenMPI's ``plm_rsh_args``: ssh's arguments as the one string that OpenMPI splits on whitespace.

    Raises:
        ValueError: a word with whitespace, which would become several arguments (an ``ssh_config`` path
            with a space, or an option smuggled in), naming the field.
    """
    for i, word in enumerate(words):
        if not word or any(c.isspace() or not c.isprintable() for c in word):
            field = {"-F": "ssh_config", "-l": "user"}.get(words[i - 1] if i else "", "ssh argument")
            raise ValueError(f"{field}={word!r}: launcher='mpi' hands ssh's arguments to OpenMPI as one string "
                             "(plm_rsh_args) that it splits on whitespace; use a value without whitespace, or "
                             "launcher='ssh'")
    return " ".join(words)


def _is_ip(address: str) -> bool:
    try:
        ipaddress.ip_address(address)
        return True
    except ValueError:
        return False


def mpi_args(plan: MultiHostPlan, controller_ip: str, workdir: Path, ssh_args: list[str]) -> list[str]:
    """``mpiexec`` arguments (OpenMPI) placing rank r on ``plan.host_of(r)``: the hostfile, slot order,
    its daemons started by ssh (one hop each), and its own traffic on the hosts' addresses only."""
    named = [h.address for h in plan.used_hosts if not _is_ip(h.address)]
    if named:  # OpenMPI's *_if_include take subnets, and a name is none
        raise ValueError(f"launcher='mpi' needs each host's IPv4 address (OpenMPI keeps its traffic to their /32 "
                         f"subnets); give the address of host {', '.join(named)}, or use launcher='ssh'")
    path = Path(workdir) / "openmpi-hostfile"
    path.write_text(openmpi_hostfile(plan))
    nets = ",".join(f"{a}/32" for a in [controller_ip, *(h.address for h in plan.used_hosts)])
    users = {h.user for h in plan.used_hosts} - {None}
    ports = {h.port for h in plan.used_hosts}
    if len(users) > 1 or len(ports) > 1:  # one ssh command line reaches every host
        raise ValueError(f"launcher='mpi' gives every host the same ssh user and port; the hosts' differ (users "
                         f"{sorted(users)}, ports {sorted(ports)}): set them per host in ssh_config instead")
    rsh = list(ssh_args) + (["-l", users.pop()] if users else []) + ["-p", str(ports.pop())]
    args = ["--hostfile", str(path), "--map-by", "slot", "--mca", "plm_rsh_agent", "ssh",
            "--mca", "plm_rsh_args", rsh_args(rsh), "--mca", "plm_rsh_no_tree_spawn", "1",
            "--mca", "oob_tcp_if_include", nets, "--mca", "btl_tcp_if_include", nets,
            "--mca", "orte_keep_fqdn_hostnames", "1"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        args.append("--allow-run-as-root")
    for name in ("WORKBENCH_RANK_ENVS", "WORKBENCH_MLX_HOSTFILE_JSON", "WORKBENCH_CONTROLLER_GRACE_S",
                 "IPP_CONNECTION_INFO", "IPP_CLUSTER_ID", "IPP_PROFILE_DIR"):
        args += ["-x", name]  # OpenMPI passes no variable to other hosts unless asked
    # MPI_THREAD_MULTIPLE: MLX calls MPI from one thread per stream (see launch.local_run.mpirun_command).
    args += ["-x", f"OMPI_MPI_THREAD_LEVEL={OMPI_THREAD_MULTIPLE}"]
    return args


def _literal(text: str) -> str:
    """``text`` as itself in a template that ipyparallel formats with ``EvalFormatter`` (which evaluates ``{...}``)."""
    return text.replace("{", "{{").replace("}", "}}")


#: ipyparallel's Slurm settings that its own template would add, and the ``#SBATCH`` option each is.
SLURM_OPTIONS = {"queue": "--partition", "account": "--account", "qos": "--qos", "timelimit": "--time"}
_SLURM_VALUE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:,+-]*")
_SLURM_WHAT = "letters, digits and _.:,+- only"


def slurm_template(plan: MultiHostPlan, nodes: list[str] | None = None, settings: dict | None = None) -> str:
    """The ``sbatch`` script for ipyparallel's Slurm launcher that puts rank r on ``plan.host_of(r)``:
    the hosts' Slurm node names (``nodes``, default: each host's name) in order, their slots in blocks.

    ``settings`` of :data:`SLURM_OPTIONS` become ``#SBATCH`` lines (ipyparallel adds them only to its own
    template). Every literal is checked (a newline would add a script line) and its braces escaped.

    Raises:
        ValueError: uneven ranks per host, a node name per host missing, or a value that is not a plain word.
    """
    used = plan.used_hosts
    nodes = list(nodes) if nodes else [h.name for h in used]
    per_node = {plan.rank_hosts.count(i) for i in sorted(set(plan.rank_hosts))}
    if len(per_node) != 1 or len(nodes) != len(used):
        raise ValueError(f"launcher='slurm' needs the same ranks on every host and one node name per host "
                         f"(ranks per host {sorted(per_node)}, nodes {nodes})")
    for node, h in zip(nodes, used):
        check_text(node, "Slurm node name", pattern=NAME, where=f" (host {h.address})",
                   what="a Slurm node name (letters, digits, '.', '_', '-')")
    extra = [f"#SBATCH {SLURM_OPTIONS[k]}={check_text(str(v), f'slurm {k}', pattern=_SLURM_VALUE, what=_SLURM_WHAT)}"
             for k, v in (settings or {}).items() if k in SLURM_OPTIONS]
    # --output: ipyparallel adds its own only to its default template; without it sbatch writes slurm-<job>.out
    # into whatever directory the driver runs in
    return ("#!/bin/sh\n#SBATCH --ntasks={n}\n" + _literal(
        f"#SBATCH --nodes={len(used)}\n#SBATCH --nodelist={','.join(nodes)}\n"
        f"#SBATCH --ntasks-per-node={per_node.pop()}\n"
        + "".join(line + "\n" for line in extra))
        + "#SBATCH --export=ALL\n#SBATCH --job-name=ipengine-{cluster_id}\n#SBATCH --output={output_file}\n"
        "srun --distribution=block {program_and_args}\n")


#: Slurm node states (``sinfo %t``, less the power and reservation suffixes) in which a job can start or wait.
SLURM_USABLE = {"idle", "mix", "alloc", "comp", "resv", "plnd"}


def check_slurm_nodes(nodes: list[str], hosts: tuple[Host, ...], timeout_s: float) -> None:
    """Ask Slurm (``sinfo``) for every node's state; raise naming each host whose node is unknown to the
    cluster, down, drained or not responding (``*``), instead of a job that waits for it until the timeout."""
    try:
        proc = subprocess.run(["sinfo", "--noheader", "--Node", "--format=%N %t"], capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except FileNotFoundError:
        raise EngineFailure("launcher='slurm': sinfo was not found; Slurm's client commands must be on PATH",
                            None) from None
    except subprocess.TimeoutExpired:
        raise EngineFailure(f"launcher='slurm': sinfo did not answer within {timeout_s:g} s", None) from None
    if proc.returncode != 0:
        raise EngineFailure(f"launcher='slurm': sinfo failed: {proc.stderr.strip()[-600:]}", None)
    states = dict(line.split(None, 1) for line in proc.stdout.splitlines() if len(line.split()) == 2)
    known = sorted(states)
    listed = ", ".join(known[:20]) + (f", ... ({len(known)} in all)" if len(known) > 20 else "") if known else "none"
    problems = [f"host {h.name} ({h.address}): Slurm node {n!r} " + (
        f"is {states[n]!r} (sinfo)" if n in states else f"is not a node of this cluster (sinfo lists {listed})")
        for n, h in zip(nodes, hosts) if states.get(n, "").rstrip("~#!%$@^-") not in SLURM_USABLE]
    if problems:
        raise EngineFailure("; ".join(problems), None)


def engine_starts(plan: MultiHostPlan, launcher: str, controller_ip: str, workdir: Path, ssh_args: list[str],
                  slurm: dict | None = None) -> list[dict]:
    """The keyword arguments of each ``ipyparallel.Cluster.start_engines`` call that starts ``plan``'s
    engines through ``launcher`` (settings of its engine set launcher): built and checked, nothing started.

    Raises:
        ValueError: a value that cannot go on the launcher's command line or into its script (named).
    """
    env, hosts = engine_env(plan), plan.used_hosts
    if launcher == "ssh":
        return [dict(n=1, environment={**env, "WORKBENCH_RANK": str(r)}, **ssh_engine_settings(plan, r, ssh_args))
                for r in range(plan.num_ranks)]
    if len({h.python for h in hosts}) > 1:
        raise ValueError(f"launcher={launcher!r} starts one command on every host; the hosts' pythons differ: "
                         f"{sorted({h.python for h in hosts})}")
    common = dict(n=plan.num_ranks, environment=env, engine_cmd=[hosts[0].python, "-m", ENGINE_MODULE])
    if launcher == "mpi":
        return [dict(common, mpi_args=mpi_args(plan, controller_ip, workdir, ssh_args))]
    settings = dict(slurm or {})
    template = slurm_template(plan, settings.pop("nodes", None), settings)
    return [dict(common, batch_file_name=str(Path(workdir) / "slurm_engine.sbatch"), batch_template=template,
                 **settings)]


def toward(address: str, port: int = 22) -> str:
    """This machine's address on the route to ``address`` (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((address, port))
        return s.getsockname()[0]


def check_reachable(hosts: tuple[Host, ...], timeout_s: float) -> None:
    """Connect to every host's sshd at once; raise naming each host that does not answer within ``timeout_s``."""
    def probe(h: Host) -> str | None:
        try:
            socket.create_connection((h.address, h.port), timeout=timeout_s).close()
            return None
        except OSError as err:
            why = "timed out" if isinstance(err, TimeoutError) else (err.strerror or str(err))
            return f"host {h.name} ({h.address}:{h.port}) unreachable: {why} after {timeout_s:g} s"

    with ThreadPoolExecutor(len(hosts)) as pool:
        problems = [p for p in pool.map(probe, hosts) if p]
    if problems:
        raise EngineFailure("; ".join(problems), None)


__all__ = ["ENGINE_MODULE", "SLURM_OPTIONS", "check_reachable", "check_slurm_nodes", "engine_env", "engine_starts",
           "mpi_args", "openmpi_hostfile", "rsh_args", "slurm_template", "ssh_engine_settings", "ssh_options", "toward"]

"""Building a rig: can it be built here, its plan (names, addresses, files), and ``up``."""

from __future__ import annotations

import ipaddress
import os
import secrets
import socket
import sys
import time
from pathlib import Path

from .errors import RigError, RigUnavailable
from .net import DEFAULT_PREFIX, FIRST_HOST_OFFSET, _PREFIX_RE, _make_bridge, _make_hosts, _names_in_use, _pick_subnet, _probe
from .procs import _tool
from .slurm import _plan_slurm, _start_slurm, check_slurm_support
from .sshd import _make_ssh_files, _start_sshds, _verify
from .state import DEFAULT_BASE, _current_user, _global_lock, _save, load
from .teardown import _quiet_down

MAX_HOSTS = 99


def check_support(prefix: str = DEFAULT_PREFIX, probe: bool = True, slurm: bool = False) -> dict[str, str]:
    """The tools the rig uses, by name; raise RigUnavailable with the precise reason if it cannot be built here.

    ``probe`` also creates (and removes) a namespace, a bridge and a veth pair, so a container that lacks
    CAP_SYS_ADMIN / CAP_NET_ADMIN is told apart from a bug in the rig.
    """
    if not sys.platform.startswith("linux"):
        raise RigUnavailable(f"needs Linux network namespaces; this is {sys.platform}")
    if os.geteuid() != 0:
        raise RigUnavailable(f"needs root (network namespaces, veths and a bridge); running as uid {os.geteuid()}")
    tools = {name: _tool(name) for name in ("ip", "ssh", "ssh-keygen", "unshare", "hostname", "sh")}
    tools["sshd"] = _tool("sshd", env="WBRIG_SSHD")
    if tools["ip"] is None:
        raise RigUnavailable("iproute2's `ip` not found (apt-get install -y iproute2)")
    if tools["sshd"] is None:
        where = os.environ.get("WBRIG_SSHD") or "sshd on PATH, /usr/sbin or /sbin"
        raise RigUnavailable(f"sshd missing: no executable {where} (apt-get install -y openssh-server, "
                             "or scripts/hosts_rig up --install-sshd)")
    for name in ("ssh", "ssh-keygen", "sh"):
        if tools[name] is None:
            raise RigUnavailable(f"`{name}` not found (apt-get install -y openssh-client)")
    if slurm:
        tools.update(check_slurm_support())
    if probe:
        _probe(prefix)
    return tools


def _plan(rig_id: str, net: ipaddress.IPv4Network, n_hosts: int, state_dir: Path, port: int, python: str, uts: bool,
          slurm: bool = False) -> dict:
    base = net.network_address
    hosts = []
    for i in range(1, n_hosts + 1):
        ns = f"{rig_id}-h{i}"
        hosts.append({
            "name": f"h{i}",
            "hostname": ns if uts else socket.gethostname(),
            "address": str(base + FIRST_HOST_OFFSET + i),
            "port": port,
            "user": _current_user(),
            "python": python,
            "cores": max(1, (os.cpu_count() or 1) // n_hosts),  # the namespaces share this machine's cores
            "netns": ns,
            "veth": f"{rig_id}v{i}",  # root side, on the bridge (``ip link set <veth> down`` cuts the host off)
            "sshd_pid": None,
            "sshd_config": str(state_dir / ns / "sshd_config"),
            "sshd_log": str(state_dir / ns / "sshd.log"),
        })
    return {
        "rig_id": rig_id,
        "status": "building",
        "state_dir": str(state_dir),
        "subnet": str(net),
        "head_address": str(base + 1),  # the root namespace, on the bridge
        "bridge": f"{rig_id}br",
        "uts": uts,
        "key": str(state_dir / "id_ed25519"),
        "ssh_config": str(state_dir / "ssh_config"),
        "known_hosts": str(state_dir / "known_hosts"),
        "ssh": str(state_dir / "bin" / "ssh"),
        "ssh_command": ["ssh", "-F", str(state_dir / "ssh_config")],
        "hosts": hosts,
        "slurm": _plan_slurm(rig_id, state_dir, hosts) if slurm else None,
        "created": time.time(),
        "created_by_pid": os.getpid(),
    }


def up(n_hosts: int = 2, state_dir: str | os.PathLike | None = None, *, prefix: str = DEFAULT_PREFIX,
       subnet: str | None = None, port: int = 22, python: str | None = None, uts: bool = True,
       verify: bool = True, base: str | os.PathLike = DEFAULT_BASE, timeout: float = 30.0, slurm: bool = False) -> dict:
    """Build a rig of ``n_hosts`` hosts and return its description (also in ``<state_dir>/rig.json``).

    ``slurm`` adds a Slurm cluster over the hosts (see the module docstring); its description is
    ``desc["slurm"]`` (``conf``, ``env``, ``nodes``, ``partition``, the daemons' pids).

    Raises RigUnavailable when this machine cannot host it (nothing is built then; SlurmUnavailable
    when only Slurm cannot run: missing, or a daemon that did not start) and RigError when building or
    checking fails; either way nothing is left behind.
    """
    if not 1 <= n_hosts <= MAX_HOSTS:
        raise ValueError(f"n_hosts must be 1..{MAX_HOSTS}, got {n_hosts}")
    if not _PREFIX_RE.fullmatch(prefix):
        raise ValueError(f"prefix must match {_PREFIX_RE.pattern} (interface names are at most 15 characters), got {prefix!r}")
    tools = check_support(prefix, slurm=slurm)
    python = python or sys.executable
    uts = uts and tools["unshare"] is not None and tools["hostname"] is not None
    base = Path(base)
    base.mkdir(parents=True, exist_ok=True, mode=0o700)

    with _global_lock():
        netns_used, links_used = _names_in_use()
        for _ in range(100):
            rig_id = f"{prefix}{secrets.token_hex(2)}"
            if not any(n.startswith(rig_id) for n in netns_used | links_used) and not (base / rig_id).exists():
                break
        else:
            raise RigError(f"no unused rig id with prefix {prefix!r}")
        net = _pick_subnet(n_hosts, subnet)
        sdir = Path(state_dir) if state_dir is not None else base / rig_id
        sdir.mkdir(parents=True, exist_ok=True, mode=0o700)
        old = load(sdir)
        if old is not None and old.get("status") != "down":
            raise RigError(f"{sdir} already records rig {old['rig_id']} ({old.get('status')}); run `down --state {sdir}` first")
        desc = _plan(rig_id, net, n_hosts, sdir.resolve(), port, python, uts, slurm)
        _save(desc)  # from here on, down(state_dir) can undo whatever exists
        try:
            _make_bridge(desc)  # claims the subnet before the lock is released
        except BaseException:
            _quiet_down(desc)
            raise
    try:
        _make_hosts(desc)
        _make_ssh_files(desc, tools)
        _start_sshds(desc, tools, timeout)
        if verify:
            _verify(desc, timeout)
        if slurm:
            _start_slurm(desc, tools, timeout)
        desc["status"] = "up"
        _save(desc)
        return desc
    except BaseException as e:
        err = _quiet_down(desc)
        if err and isinstance(e, Exception):
            raise RigError(f"{e}\n(and tearing down the half-built rig failed: {err})") from e
        raise

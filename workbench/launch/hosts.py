"""Several machines as one launch: a hosts file, and the pure multi-host part of a launch plan.

A hosts file names the machines a run may use, each with its slots (ranks it takes), how to reach it
(ssh user and port) and the Python that runs engines there. It is TOML or JSON::

    controller_ip = "10.0.0.1"        # optional: this machine's address that the hosts reach
    ssh_config = "~/.ssh/config"      # optional: passed to ssh as -F
    [[hosts]]
    address = "10.0.0.11"
    slots = 2
    user = "me"                        # optional (ssh's default)
    port = 22                          # optional
    python = "/opt/venv/bin/python"   # optional (default: python3)
    cores = 64                         # optional: its CPU cores (default: as many as this machine has)

The multi-host rig's own ``rig.json`` (``scripts/hosts_rig up``) is such a file: its hosts carry
``address``, ``port``, ``user`` and ``python``, its ``head_address`` is the controller's address.

:func:`plan_hosts_launch` is :func:`workbench.launch.plan.plan_launch` across hosts: ranks fill
host 0's slots, then host 1's, and so on (the order OpenMPI's ``--map-by slot`` uses); the MLX ring
hostfile lists each rank at its host's real address; the JAX coordinator sits on host 0's address.
It starts nothing and checks no port: ports on other machines cannot be probed from here, so they
are drawn below the ephemeral range (where only explicit listeners bind) and a clash is retried.

Every value of a hosts file is checked (:mod:`workbench.launch.host_values`) before it reaches a command
line, a remote shell or a Slurm batch template, and refused naming the field, the host and the file.
IPv6 addresses are refused: ipyparallel's ssh launcher splits ``host:port`` at the first ``:``, and the
MLX ring hostfile and OpenMPI's lists take addresses unbracketed.
"""

from __future__ import annotations

import difflib
import json
import os
import random
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from workbench.adapters.jax.distributed import GLOO_HOST_ENV
from workbench.core.checks import as_whole, read_user_text
from workbench.launch.host_values import NAME, PYTHON, USER, check_address, check_controller_ip, check_text
from workbench.launch.plan import LaunchPlan, plan_launch, thread_env

#: Ports drawn for rendezvous on remote hosts: below Linux's default ephemeral range (32768-60999).
REMOTE_PORTS = range(20000, 32000)
_HOST_KEYS = {"address", "slots", "user", "port", "python", "name", "cores"}
_FILE_KEYS = {"hosts", "controller_ip", "ssh_config", "head_address"}
#: The multi-host rig's bookkeeping in its rig.json (scripts/hosts_rig), accepted and unused there only.
_RIG_KEYS = {"rig_id", "status", "state_dir", "subnet", "bridge", "uts", "key", "known_hosts", "ssh", "ssh_command",
             "slurm", "created", "created_by_pid"}
_RIG_HOST_KEYS = {"hostname", "netns", "veth", "sshd_pid", "sshd_config", "sshd_log"}
#: Hosts files are small: past this a file is refused before it is parsed.
MAX_FILE_BYTES = 1 << 20


@dataclass(frozen=True, kw_only=True)
class Host:
    """One machine of a run.

    Attributes:
        address: IP address or DNS name the others reach it by (never a wildcard or loopback).
        slots: Ranks this host takes (>= 1).
        user: ssh user (``None``: ssh's default).
        port: sshd port.
        python: Python executable on that host that has ipyparallel and workbench installed.
        name: Label in messages (default: the address).
        cores: Its CPU cores, which its ranks share (``None``: as many as this machine has). The launch sizes
            each rank's thread pools and MLX's gather pieces by the most crowded host's ranks per core.
    """

    address: str
    slots: int = 1
    user: str | None = None
    port: int = 22
    python: str = "python3"
    name: str = ""
    cores: int | None = None

    def __post_init__(self) -> None:
        check_address(self.address, "Host.address")
        where = f" (host {self.address})"
        for key, low, high in (("slots", 1, 4096), ("port", 1, 65535), ("cores", 1, 1 << 16)):
            if key == "cores" and self.cores is None:
                continue
            value = as_whole(getattr(self, key))
            if value is None or not low <= value <= high:
                raise ValueError(f"Host.{key}={getattr(self, key)!r}{where}: must be an integer in {low}..{high}")
            object.__setattr__(self, key, value)
        if self.user is not None:
            check_text(self.user, "Host.user", pattern=USER, where=where)
        check_text(self.python, "Host.python", pattern=PYTHON, where=where)
        if self.name != "":
            check_text(self.name, "Host.name", pattern=NAME, where=where)
        else:
            object.__setattr__(self, "name", self.address)


@dataclass(frozen=True, kw_only=True)
class HostsFile:
    """A loaded hosts file: the hosts, and the settings every host shares."""

    hosts: tuple[Host, ...]
    controller_ip: str | None = None
    ssh_config: str | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if not self.hosts:
            raise ValueError(f"hosts file {self.source or ''}: lists no hosts")
        try:
            if self.controller_ip is not None:
                object.__setattr__(self, "controller_ip", check_controller_ip(self.controller_ip))
            if self.ssh_config is not None:
                check_text(self.ssh_config, "ssh_config", split=False)
        except ValueError as err:
            raise ValueError(f"hosts file {self.source}: {err}" if self.source else str(err)) from None
        seen = {}
        for h in self.hosts:
            if (h.address, h.port) in seen:
                raise ValueError(f"hosts file {self.source}: host {h.address} port {h.port} is listed twice")
            seen[h.address, h.port] = h

    @property
    def num_slots(self) -> int:
        return sum(h.slots for h in self.hosts)


def _unknown(keys, known: set[str], allowed: set[str], where: str) -> None:
    unknown = [k for k in keys if k not in allowed]
    if unknown:
        hints = [f"{k!r}" + (f" (did you mean {near[0]!r}?)" if (near := difflib.get_close_matches(str(k), known, 1))
                             else "") for k in unknown]
        raise ValueError(f"{where}unknown key{'s' if len(unknown) > 1 else ''} {', '.join(hints)}; "
                         f"the keys are {', '.join(sorted(known))}")


def parse_hosts(data: dict, *, source: str = "", slots: int | None = None) -> HostsFile:
    """A :class:`HostsFile` from a parsed TOML/JSON document; ``slots`` overrides every host's slots.

    Raises:
        ValueError: naming the file, the host and the key (unknown keys are errors, with the near known
            key, so a typo is not ignored) or the value at fault.
    """
    at = f"hosts file {source}: " if source else "hosts: "
    if not isinstance(data, dict) or not isinstance(data.get("hosts"), list):
        raise ValueError(f"{at}needs a list 'hosts' of tables, one per host")
    rig = "rig_id" in data  # the multi-host rig's rig.json also carries the rig's own bookkeeping
    _unknown(data, _FILE_KEYS, _FILE_KEYS | (_RIG_KEYS if rig else set()), at)
    hosts = []
    for i, entry in enumerate(data["hosts"]):
        if not isinstance(entry, dict):
            raise ValueError(f"{at}hosts[{i}] must be a table, got {entry!r}")
        _unknown(entry, _HOST_KEYS, _HOST_KEYS | (_RIG_HOST_KEYS if rig else set()), f"{at}hosts[{i}]: ")
        known = {k: v for k, v in entry.items() if k in _HOST_KEYS}
        if "address" not in known:
            raise ValueError(f"{at}hosts[{i}] has no 'address'")
        if slots is not None:
            known["slots"] = slots
        try:
            hosts.append(Host(**known))
        except ValueError as err:
            raise ValueError(f"{at}hosts[{i}]: {err}") from None
    controller, head = data.get("controller_ip"), data.get("head_address")
    if controller is not None and head is not None and controller != head:
        raise ValueError(f"{at}controller_ip={controller!r} and head_address={head!r} differ: give one")
    config = data.get("ssh_config")
    try:
        config = None if config is None else str(Path(check_text(config, "ssh_config", split=False)).expanduser())
    except ValueError as err:
        raise ValueError(f"{at}{err}") from None
    return HostsFile(hosts=tuple(hosts), controller_ip=head if controller is None else controller, ssh_config=config,
                     source=source)


def load_hosts(path: str | Path, *, slots: int | None = None) -> HostsFile:
    """Read a hosts file (``.toml``, or JSON such as the rig's ``rig.json``); see the module docstring.

    Raises:
        ValueError: naming the file: missing, not a regular file, over :data:`MAX_FILE_BYTES`, not UTF-8,
            not TOML/JSON, or any of :func:`parse_hosts`'s errors.
    """
    path = Path(path).expanduser()
    if not path.is_file():  # a FIFO would block the read
        raise ValueError(f"hosts file {path}: {'not a regular file' if path.exists() else 'no such file'}")
    text = read_user_text(path, MAX_FILE_BYTES, f"hosts file {path}", "too large for a list of hosts")
    try:
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (ValueError, RecursionError) as err:  # JSONDecodeError and TOMLDecodeError are ValueErrors
        raise ValueError(f"hosts file {path}: cannot parse: {err}") from None
    return parse_hosts(data, source=str(path), slots=slots)


def as_hosts(hosts, *, slots: int | None = None) -> HostsFile:
    """Accept a :class:`HostsFile`, a path to one, or a sequence of :class:`Host`."""
    if isinstance(hosts, HostsFile):
        return hosts if slots is None else HostsFile(
            hosts=tuple(Host(**{**h.__dict__, "slots": slots}) for h in hosts.hosts),
            controller_ip=hosts.controller_ip, ssh_config=hosts.ssh_config, source=hosts.source)
    if isinstance(hosts, (str, Path)):
        return load_hosts(hosts, slots=slots)
    return as_hosts(HostsFile(hosts=tuple(hosts)), slots=slots)


def place_ranks(hosts: HostsFile, num_ranks: int) -> tuple[int, ...]:
    """The host index of each rank: host 0's slots first, then host 1's (``--map-by slot``).

    Raises:
        ValueError: more ranks than slots.
    """
    if num_ranks > hosts.num_slots:
        raise ValueError(f"num_ranks={num_ranks}: the hosts have only {hosts.num_slots} slots "
                         f"({', '.join(f'{h.name}: {h.slots}' for h in hosts.hosts)})")
    placement = [i for i, h in enumerate(hosts.hosts) for _ in range(h.slots)]
    return tuple(placement[:num_ranks])


def most_crowded(hosts: HostsFile, placement: Sequence[int]) -> tuple[int, int | None]:
    """``(ranks, cores)`` of the host with the most of :func:`place_ranks`'s ranks per core (``cores`` None: this
    machine's count); ``(1, None)`` for no ranks."""
    counts = Counter(placement)
    if not counts:
        return 1, None
    here = os.cpu_count() or 1
    i = max(counts, key=lambda h: (counts[h] / (hosts.hosts[h].cores or here), -h))
    return counts[i], hosts.hosts[i].cores


def busiest_host_ranks(placement: Sequence[int]) -> int:
    """The most ranks :func:`place_ranks`'s ``placement`` puts on one host (1 for none): they share its cores."""
    return max(Counter(placement).values(), default=1)


def replica_groups(placement: Sequence[int]) -> int | None:
    """HSDP's replica groups of :func:`place_ranks`'s ``placement``: the hosts, where there are 2 or more and each
    holds the same number of ranks, 2 or more (a shard group per host); else None."""
    per_host = set(Counter(placement).values())
    hosts = len(set(placement))
    return hosts if hosts >= 2 and len(per_host) == 1 and min(per_host) >= 2 else None


@dataclass(frozen=True, kw_only=True)
class MultiHostPlan(LaunchPlan):
    """A :class:`LaunchPlan` whose ranks live on several hosts: ``rank_hosts[r]`` indexes ``hosts``."""

    hosts: tuple[Host, ...] = field(default=())
    rank_hosts: tuple[int, ...] = field(default=())

    def host_of(self, rank: int) -> Host:
        return self.hosts[self.rank_hosts[rank]]

    @property
    def hostfile(self) -> list[list[str]] | None:
        """MLX ring hostfile: one ``["address:port"]`` per rank, at its host's address."""
        if self.framework == "mlx" and self.backend == "ring":
            return [[f"{self.host_of(r).address}:{p}"] for r, p in enumerate(self.ports)]
        return None

    @property
    def used_hosts(self) -> tuple[Host, ...]:
        """The hosts that carry at least one rank, in order."""
        return tuple(self.hosts[i] for i in sorted(set(self.rank_hosts)))


def remote_ports(count: int, seed: int | None = None) -> list[int]:
    """``count`` distinct ports from :data:`REMOTE_PORTS` (not probed: they are on other machines)."""
    return random.Random(seed).sample(REMOTE_PORTS, count)


def plan_hosts_launch(hosts, num_ranks: int | None = None, *, framework: str = "mlx", backend: str | None = None,
                      ports: list[int] | None = None, env: dict[str, str] | None = None,
                      seed: int | None = None) -> MultiHostPlan:
    """Plan ``num_ranks`` ranks (default: every slot) across ``hosts`` (pure; starts nothing).

    Each rank's environment is :func:`plan_launch`'s, with the JAX coordinator (and NCCL's rendezvous)
    on host 0's address, and thread pools sized by the busiest host's ranks.

    Raises:
        ValueError: as :func:`plan_launch`, or more ranks than slots.
    """
    hf = as_hosts(hosts)
    num_ranks = hf.num_slots if num_ranks is None else num_ranks
    placement = place_ranks(hf, num_ranks) if isinstance(num_ranks, int) and num_ranks >= 1 else ()
    if ports is None and isinstance(num_ranks, int) and num_ranks >= 1:
        ports = remote_ports(num_ranks if framework == "mlx" and backend in (None, "ring") else 1, seed)
    base = plan_launch(num_ranks, framework=framework, backend=backend, host=hf.hosts[0].address, ports=ports,
                       env={**thread_env(*most_crowded(hf, placement)), **(env or {})})
    rank_env = base.rank_env
    if framework == "jax":  # gloo listens on each rank's own host (the coordinator's address exists on host 0 only)
        rank_env = tuple({**e, GLOO_HOST_ENV: hf.hosts[placement[r]].address} for r, e in enumerate(rank_env))
    return MultiHostPlan(framework=base.framework, backend=base.backend, num_ranks=base.num_ranks, host=base.host,
                         ports=base.ports, rank_env=rank_env, hosts=hf.hosts, rank_hosts=placement)

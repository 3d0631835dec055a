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

The multi-host rig's own ``rig.json`` (``scripts/hosts_rig.py up``) is such a file: its hosts carry
``address``, ``port``, ``user`` and ``python``, its ``head_address`` is the controller's address.

:func:`plan_hosts_launch` is :func:`workbench.launch.plan.plan_launch` across hosts: ranks fill
host 0's slots, then host 1's, and so on (the order OpenMPI's ``--map-by slot`` uses); the MLX ring
hostfile lists each rank at its host's real address; the JAX coordinator sits on host 0's address.
It starts nothing and checks no port: ports on other machines cannot be probed from here, so they
are drawn below the ephemeral range (where only explicit listeners bind) and a clash is retried.
"""

from __future__ import annotations

import ipaddress
import json
import random
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from workbench.launch.plan import LaunchPlan, plan_launch, thread_env
from workbench.ranks.jax_fsdp_check import GLOO_HOST_ENV

#: Ports drawn for rendezvous on remote hosts: below Linux's default ephemeral range (32768-60999).
REMOTE_PORTS = range(20000, 32000)
_HOST_KEYS = {"address", "slots", "user", "port", "python", "name"}
_FILE_KEYS = {"hosts", "controller_ip", "ssh_config", "head_address"}


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
    """

    address: str
    slots: int = 1
    user: str | None = None
    port: int = 22
    python: str = "python3"
    name: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.address, str) or not self.address.strip() or any(c.isspace() for c in self.address):
            raise ValueError(f"Host.address={self.address!r}: must be an IP address or host name")
        try:
            ip = ipaddress.ip_address(self.address)
        except ValueError:
            ip = None
        if (ip is not None and (ip.is_unspecified or ip.is_loopback)) or self.address == "localhost":
            raise ValueError(f"Host.address={self.address!r}: a wildcard or loopback address cannot be reached "
                             "from another host; give the address the hosts reach each other by")
        for key, low, high in (("slots", 1, 4096), ("port", 1, 65535)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"Host.{key}={value!r} (host {self.address}): must be an integer in {low}..{high}")
        if not isinstance(self.python, str) or not self.python:
            raise ValueError(f"Host.python={self.python!r} (host {self.address}): the Python executable on that host")
        if not self.name:
            object.__setattr__(self, "name", self.address)

    @property
    def location(self) -> str:
        """``user@address`` (or the address) as ssh takes it."""
        return f"{self.user}@{self.address}" if self.user else self.address


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
        seen = {}
        for h in self.hosts:
            if (h.address, h.port) in seen:
                raise ValueError(f"hosts file {self.source}: host {h.address} port {h.port} is listed twice")
            seen[h.address, h.port] = h

    @property
    def num_slots(self) -> int:
        return sum(h.slots for h in self.hosts)


def parse_hosts(data: dict, *, source: str = "", slots: int | None = None) -> HostsFile:
    """A :class:`HostsFile` from a parsed TOML/JSON document; ``slots`` overrides every host's slots.

    Raises:
        ValueError: naming the key and the host (unknown keys are errors, so a typo is not ignored).
    """
    if not isinstance(data, dict) or not isinstance(data.get("hosts"), list):
        raise ValueError(f"hosts file {source}: needs a list 'hosts' of tables, one per host")
    hosts = []
    for i, entry in enumerate(data["hosts"]):
        if not isinstance(entry, dict):
            raise ValueError(f"hosts file {source}: hosts[{i}] must be a table, got {entry!r}")
        known = {k: v for k, v in entry.items() if k in _HOST_KEYS}
        if "address" not in known:
            raise ValueError(f"hosts file {source}: hosts[{i}] has no 'address'")
        if slots is not None:
            known["slots"] = slots
        hosts.append(Host(**known))
    controller = data.get("controller_ip", data.get("head_address"))
    config = data.get("ssh_config")
    return HostsFile(hosts=tuple(hosts), controller_ip=controller, ssh_config=str(Path(config).expanduser()) if config else None,
                     source=source)


def load_hosts(path: str | Path, *, slots: int | None = None) -> HostsFile:
    """Read a hosts file (``.toml``, or JSON such as the rig's ``rig.json``); see the module docstring."""
    path = Path(path).expanduser()
    text = path.read_text()
    try:
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as err:
        raise ValueError(f"hosts file {path}: cannot parse: {err}") from err
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
    busiest = max((placement.count(i) for i in set(placement)), default=1)
    base = plan_launch(num_ranks, framework=framework, backend=backend, host=hf.hosts[0].address, ports=ports,
                       env={**thread_env(busiest), **(env or {})})
    rank_env = base.rank_env
    if framework == "jax":  # gloo listens on each rank's own host (the coordinator's address exists on host 0 only)
        rank_env = tuple({**e, GLOO_HOST_ENV: hf.hosts[placement[r]].address} for r, e in enumerate(rank_env))
    return MultiHostPlan(framework=base.framework, backend=base.backend, num_ranks=base.num_ranks, host=base.host,
                         ports=base.ports, rank_env=rank_env, hosts=hf.hosts, rank_hosts=placement)

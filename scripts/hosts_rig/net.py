"""The rig's network: a bridge in the root namespace (the head), and per host a network namespace joined
to it by a veth pair, with one address in a free /24 of 198.18.0.0/15 and no route off the rig."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import secrets
import socket
import subprocess
from pathlib import Path

from .errors import RigError, RigUnavailable
from .procs import _pids, _run, _tool

DEFAULT_PREFIX = "wbrig"
_PREFIX_RE = re.compile(r"[a-z][a-z0-9]{0,6}")  # + 4 hex id + "v" + 2 digits <= 15 (IFNAMSIZ - 1)
POOL = ipaddress.ip_network("198.18.0.0/15")  # RFC 2544 benchmarking range, never routed on the internet
FIRST_HOST_OFFSET = 10  # host i (1-based) gets network address + 10 + i: .11, .12, ...


def _ip(*args: str, check: bool = True, netns: str | None = None) -> subprocess.CompletedProcess:
    cmd = [_tool("ip") or "ip"] + (["-n", netns] if netns else []) + list(args)
    return _run(cmd, check=check)


def _gone_ok(proc: subprocess.CompletedProcess) -> bool:
    err = proc.stderr or ""
    return proc.returncode == 0 or "Cannot find device" in err or "No such file" in err or "does not exist" in err


def _probe(prefix: str) -> None:
    """Create (and remove) a namespace, a bridge and a veth pair; raise RigUnavailable naming the step refused.

    Tells a container that lacks CAP_SYS_ADMIN / CAP_NET_ADMIN apart from a bug in the rig.
    """
    tag = f"{prefix}{secrets.token_hex(2)}"
    ns, br, veth = f"{tag}-probe", f"{tag}pb", f"{tag}pv"
    steps = [
        (["netns", "add", ns], "create a network namespace"),
        (["link", "add", br, "type", "bridge"], "create a bridge"),
        (["link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns], "create a veth pair into a namespace"),
    ]
    try:
        for args, what in steps:
            proc = _ip(*args, check=False)
            if proc.returncode != 0:
                raise RigUnavailable(f"cannot {what}: `ip {' '.join(args)}` failed: {proc.stderr.strip()}")
    finally:
        _ip("link", "del", veth, check=False)
        _ip("link", "del", br, check=False)
        _ip("netns", "del", ns, check=False)


def _names_in_use() -> tuple[set[str], set[str]]:
    netns = {line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()}
    links = set()
    for line in _ip("-o", "link", "show").stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) > 1:
            links.add(parts[1].strip().split("@")[0])
    return netns, links


def _networks_in_use() -> list[ipaddress.IPv4Network]:
    used = []
    for line in _ip("-4", "-o", "addr", "show").stdout.splitlines():
        m = re.search(r"\binet (\S+)", line)
        if m:
            used.append(ipaddress.ip_interface(m.group(1)).network)
    for line in _ip("-4", "route", "show", "table", "all").stdout.splitlines():
        dest = line.split()[0] if line.split() else ""
        if dest in ("default", "local", "broadcast", "multicast", "unreachable", "prohibit", "blackhole"):
            dest = line.split()[1] if dest != "default" and len(line.split()) > 1 else ""
        with contextlib.suppress(ValueError):
            net = ipaddress.ip_network(dest, strict=False)
            if net.prefixlen > 0:
                used.append(net)
    return used


def _pick_subnet(n_hosts: int, subnet: str | None) -> ipaddress.IPv4Network:
    used = _networks_in_use()
    need = FIRST_HOST_OFFSET + n_hosts + 2
    if subnet:
        net = ipaddress.ip_network(subnet, strict=True)
        if net.version != 4 or net.num_addresses < need:
            raise RigError(f"subnet {net} must be IPv4 with room for the bridge and {n_hosts} hosts (.{FIRST_HOST_OFFSET + 1}..)")
        clash = [str(u) for u in used if u.overlaps(net)]
        if clash:
            raise RigError(f"subnet {net} overlaps what this machine already uses ({', '.join(sorted(set(clash)))}); "
                           "choose another with --subnet")
        return net
    for net in POOL.subnets(new_prefix=24):
        if not any(u.overlaps(net) for u in used):
            return net
    raise RigError(f"no free /24 left in {POOL}; tear down old rigs (down --prefix {DEFAULT_PREFIX})")


def _make_bridge(desc: dict) -> None:
    br, plen = desc["bridge"], ipaddress.ip_network(desc["subnet"]).prefixlen
    _ip("link", "add", br, "type", "bridge")
    _ip("link", "set", br, "addrgenmode", "none")  # no IPv6 link-local: the rig speaks only its IPv4 addresses
    _ip("addr", "add", f"{desc['head_address']}/{plen}", "dev", br)
    _ip("link", "set", br, "up")


def _make_hosts(desc: dict) -> None:
    plen = ipaddress.ip_network(desc["subnet"]).prefixlen
    hosts_file = ["127.0.0.1\tlocalhost", f"{desc['head_address']}\t{desc['rig_id']}-head"]
    hosts_file += [f"{h['address']}\t{h['hostname']}" for h in desc["hosts"] if desc["uts"]]
    for h in desc["hosts"]:
        ns, veth = h["netns"], h["veth"]
        _ip("netns", "add", ns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", veth, "addrgenmode", "none")
        _ip("link", "set", veth, "master", desc["bridge"])
        _ip("link", "set", veth, "up")
        _ip("link", "set", "eth0", "addrgenmode", "none", netns=ns)
        _ip("addr", "add", f"{h['address']}/{plen}", "dev", "eth0", netns=ns)
        _ip("link", "set", "eth0", "up", netns=ns)
        _ip("link", "set", "lo", "up", netns=ns)
        if desc["uts"]:
            etc = Path("/etc/netns") / ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text("\n".join(hosts_file + [f"{h['address']}\t{h['hostname']}"]) + "\n")


def _pids_in_netns(names: list[str]) -> set[int]:
    """Every process inside the named namespaces (as ``ip netns pids``, for several at once)."""
    ids = set()
    for name in names:
        with contextlib.suppress(OSError):
            st = os.stat(f"/run/netns/{name}")
            ids.add((st.st_dev, st.st_ino))
    if not ids:
        return set()
    found = set()
    for pid in _pids():
        with contextlib.suppress(OSError):
            st = os.stat(f"/proc/{pid}/ns/net")
            if (st.st_dev, st.st_ino) in ids:
                found.add(pid)
    return found


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]

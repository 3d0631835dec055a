"""A multi-host rig on one machine: each "host" is a Linux network namespace with its own sshd.

    python scripts/hosts_rig check                    # can the rig be built here? (exit 0, or 2 and why not)
    python scripts/hosts_rig up --hosts 2 [--state DIR] [--slurm] [--foreground]
    python scripts/hosts_rig down --state DIR         # or: down --prefix wbrig (every rig of that prefix)

What ``up`` builds (all of it is torn down by ``down``):

* a bridge in the root namespace holding the rig's first address (198.18.0.1 in 198.18.0.0/24 unless
  that /24 is taken or ``--subnet`` says otherwise): the root namespace is the "head" that reaches
  every host, and where a controller would listen;
* per host a namespace, a veth pair (the root side enslaved to the bridge, the other side ``eth0`` in
  the namespace) and one address (.11, .12, ...). Hosts get no default route: the rig's subnet is all
  they can reach, and nothing is routed off the machine;
* per host an ``sshd`` listening only on that host's address, inside the namespace, with its own
  host key and, by default, its own hostname (a UTS namespace) that every host resolves
  (``/etc/netns/<namespace>/hosts``, which ``ip netns exec`` mounts over ``/etc/hosts``);
* an ed25519 client key, ``known_hosts`` and an ssh config, so ``ssh -F <state>/ssh_config <address>``
  (or ``<state>/bin/ssh <address>``) logs in non-interactively (BatchMode, host keys checked);
* with ``--slurm``, a Slurm cluster (Debian's slurm-wlm and munge), all of it under
  ``<state>/<rig id>-slurm/``: a ``munged`` with a key generated for the rig and its socket there, a
  ``slurmctld`` on the head (in a UTS and mount namespace of its own, named ``<rig id>-head`` and
  listening only on the head's address) and one ``slurmd`` per host, inside the host's namespace, whose
  Slurm node name is the host's name (``h1``, ``h2``, ...), all in one partition ``rig``. Client
  commands find it by ``SLURM_CONF=<state>/<rig id>-slurm/slurm.conf`` (``slurm.env`` in the
  description); ``up`` returns once every node is idle.

The namespaces share the filesystem, so a host runs the repository's own Python. ``up`` prints the
rig's description (also written to ``<state>/rig.json``): addresses, ssh port, user, python, key,
ssh config. Names start with a prefix (``wbrig``) and a random id, and each rig takes a free /24,
so concurrent rigs do not clash. ``up`` records its plan before it builds anything, so ``down
--state`` cleans up after an ``up`` that crashed; ``down --prefix`` cleans up by name when even the
state is lost. ``down`` kills every process inside the rig's namespaces (sshd, sessions, engines),
removes namespaces, veths and bridge, checks that nothing is left, and is idempotent.

Needs Linux, root, iproute2 and Debian's openssh-server (``up --install-sshd`` installs it); ``--slurm``
also needs ``slurm-wlm`` and ``munge``. Every command it runs has a timeout.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import ipaddress
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_PREFIX = "wbrig"
DEFAULT_BASE = Path(os.environ.get("WBRIG_BASE", "/run/wbrig"))  # tmpfs: state lives as long as the namespaces
POOL = ipaddress.ip_network("198.18.0.0/15")  # RFC 2544 benchmarking range, never routed on the internet
FIRST_HOST_OFFSET = 10  # host i (1-based) gets network address + 10 + i: .11, .12, ...
MAX_HOSTS = 99
CMD_TIMEOUT_S = 10.0
STATE_FILE = "rig.json"
_OWN_FILES = ("rig.json", "id_ed25519", "id_ed25519.pub", "authorized_keys", "known_hosts", "ssh_config")
_PREFIX_RE = re.compile(r"[a-z][a-z0-9]{0,6}")  # + 4 hex id + "v" + 2 digits <= 15 (IFNAMSIZ - 1)
_LOCK_PATH = Path("/run/lock/wbrig-rig.lock") if Path("/run/lock").is_dir() else Path("/tmp/wbrig-rig.lock")


class RigUnavailable(RuntimeError):
    """This machine cannot host the rig (not Linux, not root, no iproute2, no netns, no sshd); says which and why."""


class RigError(RuntimeError):
    """Building, checking or tearing down the rig failed."""


class SlurmUnavailable(RigUnavailable):
    """Slurm on the rig cannot run here: slurm-wlm or munge missing, or one of their daemons did not start
    (the message quotes its log). The rest of the rig was fine; nothing is left behind."""


# --------------------------------------------------------------------------------------------- commands


def _tool(name: str, env: str | None = None) -> str | None:
    if env and os.environ.get(env):
        path = os.environ[env]
        return path if os.access(path, os.X_OK) else None
    found = shutil.which(name)
    if found:
        return found
    for d in ("/usr/sbin", "/sbin", "/usr/bin", "/bin"):
        if os.access(f"{d}/{name}", os.X_OK):
            return f"{d}/{name}"
    return None


def _run(cmd: list[str], timeout: float = CMD_TIMEOUT_S, check: bool = True, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("stdin", subprocess.DEVNULL)
    if "stdout" not in kw and "stderr" not in kw:
        kw["capture_output"] = True
    try:
        proc = subprocess.run(cmd, check=False, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        raise RigError(f"timed out after {timeout:g} s: {shlex.join(cmd)}") from e
    if check and proc.returncode != 0:
        msg = (proc.stderr or "").strip() or (proc.stdout or "").strip()
        raise RigError(f"`{shlex.join(cmd)}` exited {proc.returncode}: {msg}")
    return proc


def _ip(*args: str, check: bool = True, netns: str | None = None) -> subprocess.CompletedProcess:
    cmd = [_tool("ip") or "ip"] + (["-n", netns] if netns else []) + list(args)
    return _run(cmd, check=check)


def _gone_ok(proc: subprocess.CompletedProcess) -> bool:
    err = proc.stderr or ""
    return proc.returncode == 0 or "Cannot find device" in err or "No such file" in err or "does not exist" in err


# --------------------------------------------------------------------------------------------- support


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
    return tools


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


def install_sshd(timeout: float = 600) -> None:
    """Debian's openssh-server, with apt-get (root). Note: on a systemd host the package also starts the system sshd."""
    if _tool("sshd", env="WBRIG_SSHD"):
        return
    apt = _tool("apt-get")
    if apt is None or os.geteuid() != 0:
        raise RigUnavailable("sshd missing and apt-get cannot install it here (needs Debian and root)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    proc = _run([apt, "install", "-y", "-qq", "openssh-server"], timeout=timeout, check=False, env=env)
    if proc.returncode != 0:
        _run([apt, "update", "-qq"], timeout=timeout, env=env)
        _run([apt, "install", "-y", "-qq", "openssh-server"], timeout=timeout, env=env)


# --------------------------------------------------------------------------------------------- state


def _save(desc: dict) -> None:
    path = Path(desc["state_dir"]) / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(desc, indent=2) + "\n")
    os.replace(tmp, path)


def load(state_dir: str | os.PathLike) -> dict | None:
    """The rig recorded in ``state_dir`` (its rig.json), or None when there is none."""
    path = Path(state_dir) / STATE_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


@contextlib.contextmanager
def _global_lock(timeout: float = 30.0):
    """Serialises picking a rig id and a subnet across concurrent ``up``s (threads or processes)."""
    fd = os.open(_LOCK_PATH, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RigError(f"timed out after {timeout:g} s waiting for {_LOCK_PATH}") from None
                time.sleep(0.02)
        yield
    finally:
        os.close(fd)  # releases the lock


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


def _current_user() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


# --------------------------------------------------------------------------------------------- up


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


def _quiet_down(desc: dict) -> str | None:
    try:
        teardown(desc)
    except Exception as e:  # noqa: BLE001 - reported alongside the original error
        return str(e)
    return None


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


def _make_ssh_files(desc: dict, tools: dict) -> None:
    sdir = Path(desc["state_dir"])
    key = Path(desc["key"])
    for p in (key, key.with_suffix(".pub")):
        p.unlink(missing_ok=True)
    _run([tools["ssh-keygen"], "-q", "-t", "ed25519", "-N", "", "-C", f"{desc['rig_id']} client", "-f", str(key)])
    (sdir / "authorized_keys").write_text(key.with_suffix(".pub").read_text())
    known, config = [], [
        f"# ssh config of multi-host rig {desc['rig_id']} (scripts/hosts_rig); use with ssh -F {desc['ssh_config']}",
    ]
    for h in desc["hosts"]:
        hdir = Path(h["sshd_config"]).parent
        hdir.mkdir(exist_ok=True, mode=0o700)
        hkey = hdir / "ssh_host_ed25519_key"
        _run([tools["ssh-keygen"], "-q", "-t", "ed25519", "-N", "", "-C", h["hostname"], "-f", str(hkey)])
        pub = " ".join(hkey.with_suffix(".pub").read_text().split()[:2])
        names = [h["address"], h["hostname"]] if desc["uts"] else [h["address"]]
        if h["port"] != 22:
            names = [f"[{n}]:{h['port']}" for n in names]
        known.append(f"{','.join(names)} {pub}")
        config += [f"Host {h['address']} {h['hostname'] if desc['uts'] else h['name']}",
                   f"  HostName {h['address']}", f"  Port {h['port']}", f"  User {h['user']}"]
        Path(h["sshd_config"]).write_text("\n".join([
            f"# sshd of rig host {h['name']} ({h['netns']}), scripts/hosts_rig",
            f"ListenAddress {h['address']}:{h['port']}",
            f"HostKey {hkey}",
            f"PidFile {hdir / 'sshd.pid'}",
            f"AuthorizedKeysFile {sdir / 'authorized_keys'}",
            f"AllowUsers {h['user']}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "UseDNS no",
            "PrintMotd no",
            "PrintLastLog no",
            "X11Forwarding no",
            "MaxStartups 200:30:400",  # engines are launched many at once
            "MaxSessions 200",
            "ClientAliveInterval 5",  # a session whose client vanished ends within ~15 s
            "ClientAliveCountMax 3",
            "LogLevel INFO",
            "Subsystem sftp internal-sftp",
        ]) + "\n")
    config += [
        "Host *",
        f"  IdentityFile {key}",
        "  IdentitiesOnly yes",
        f"  UserKnownHostsFile {desc['known_hosts']}",
        "  GlobalKnownHostsFile /dev/null",
        "  StrictHostKeyChecking yes",
        "  CheckHostIP no",
        "  BatchMode yes",
        "  ConnectTimeout 5",
        "  ServerAliveInterval 5",
        "  ServerAliveCountMax 3",
        "  AddressFamily inet",
        "  ControlMaster no",
        "  LogLevel ERROR",
    ]
    Path(desc["known_hosts"]).write_text("\n".join(known) + "\n")
    Path(desc["ssh_config"]).write_text("\n".join(config) + "\n")
    bindir = sdir / "bin"
    bindir.mkdir(exist_ok=True)
    for name in ("ssh", "scp"):
        real = _tool(name) or f"/usr/bin/{name}"
        wrapper = bindir / name
        wrapper.write_text(f"#!/bin/sh\n# {name} into rig {desc['rig_id']}\n"
                           f"exec {shlex.quote(real)} -F {shlex.quote(desc['ssh_config'])} \"$@\"\n")
        wrapper.chmod(0o755)


def _start_sshds(desc: dict, tools: dict, timeout: float) -> None:
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    for h in desc["hosts"]:
        hdir = Path(h["sshd_config"]).parent
        (hdir / "sshd.pid").unlink(missing_ok=True)
        cmd = [tools["ip"], "netns", "exec", h["netns"]]
        if desc["uts"]:
            cmd += [tools["unshare"], "--uts", tools["sh"], "-c", 'hostname "$0" && exec "$@"', h["hostname"]]
        cmd += [tools["sshd"], "-f", h["sshd_config"], "-E", h["sshd_log"]]  # daemonises, so the rig outlives `up`
        with open(hdir / "start.log", "w") as log:
            proc = _run(cmd, check=False, stdout=log, stderr=subprocess.STDOUT)
        if proc.returncode != 0:
            raise RigError(f"sshd of {h['name']} did not start (exit {proc.returncode}): "
                           f"{_tail(hdir / 'start.log')} {_tail(h['sshd_log'])}")
    deadline = time.monotonic() + timeout
    pending = list(desc["hosts"])
    while pending:
        for h in list(pending):
            pid = _read_pid(Path(h["sshd_config"]).parent / "sshd.pid")
            if pid is None:
                continue
            if h["sshd_pid"] != pid:
                h["sshd_pid"] = pid
                _save(desc)
            if not _alive(pid):
                raise RigError(f"sshd of {h['name']} (pid {pid}) exited: {_tail(h['sshd_log'])}")
            with contextlib.suppress(OSError), socket.create_connection((h["address"], h["port"]), timeout=0.5):
                pending.remove(h)
        if pending and time.monotonic() > deadline:
            raise RigError(f"sshd not reachable within {timeout:g} s on " + ", ".join(
                f"{h['name']} {h['address']}:{h['port']} ({_tail(h['sshd_log'])})" for h in pending))
        if pending:
            time.sleep(0.01)


_VERIFY = ("import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 5).close(); "
           "print(socket.gethostname())")


def _verify(desc: dict, timeout: float) -> None:
    """Each host: ssh in, run the rig's python, which reaches the next host's sshd over the bridge."""
    hosts = desc["hosts"]
    procs = []
    for i, h in enumerate(hosts):
        nxt = hosts[(i + 1) % len(hosts)]
        procs.append(subprocess.Popen(
            ssh_argv(desc, h, [h["python"], "-c", _VERIFY, nxt["address"], str(nxt["port"])]),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    deadline = time.monotonic() + timeout
    problems = []
    for h, p in zip(hosts, procs):
        try:
            out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            problems.append(f"{h['name']}: no answer over ssh within {timeout:g} s")
            continue
        if p.returncode != 0:
            problems.append(f"{h['name']} ({h['address']}): exit {p.returncode}: {err.strip()}")
        elif desc["uts"] and out.strip() != h["hostname"]:
            problems.append(f"{h['name']}: hostname {out.strip()!r}, expected {h['hostname']!r}")
    if problems:
        hint = ""
        if Path("/proc/sys/net/bridge/bridge-nf-call-iptables").exists():
            hint = (" (bridged traffic passes iptables here, bridge-nf-call-iptables: a FORWARD policy of DROP,"
                    " as Docker sets, would drop traffic between hosts)")
        raise RigError("rig check failed: " + "; ".join(problems) + hint)


# --------------------------------------------------------------------------------------------- slurm

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


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


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


def _descendants(pids: set[int]) -> set[int]:
    """``pids`` and every process below them (slurmctld's slurmscriptd, say)."""
    parent = {}
    for pid in _pids():
        with contextlib.suppress(OSError, IndexError, ValueError):
            parent[pid] = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    found, frontier = set(pids), set(pids)
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier and p not in found}
        found |= frontier
    return found


def _slurm_pids(marker: re.Pattern | str) -> set[int]:
    """The rig's Slurm and munge daemons, by their command line (every one names a file in the rig's Slurm
    directory), and what they started."""
    if isinstance(marker, str):
        marker = re.compile(re.escape(marker))
    return _descendants({pid for pid in _pids() if pid != os.getpid() and marker.search(_cmdline(pid))})


def _tail(path, n: int = 600) -> str:
    try:
        return Path(path).read_text(errors="replace")[-n:].strip()
    except OSError:
        return ""


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------------------------- using it


def ssh_argv(desc: dict, host: dict | int | str, command: list[str] | str) -> list[str]:
    """The argv that runs ``command`` on ``host`` (a host dict, index, name, hostname or address) over ssh.

    A list is quoted for the remote shell; a string is passed as the remote shell command line.
    """
    h = find_host(desc, host)
    remote = shlex.join(command) if isinstance(command, list) else command
    return [_tool("ssh") or "ssh", "-F", desc["ssh_config"], h["address"], remote]


def ssh(desc: dict, host, command: list[str] | str, timeout: float = 30.0, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``command`` on ``host`` over ssh; raises RigError if it fails (with ``check``) or times out."""
    return _run(ssh_argv(desc, host, command), timeout=timeout, check=check)


def find_host(desc: dict, host) -> dict:
    if isinstance(host, dict):
        return host
    if isinstance(host, int):
        return desc["hosts"][host]
    for h in desc["hosts"]:
        if host in (h["name"], h["hostname"], h["address"], h["netns"]):
            return h
    raise KeyError(f"no host {host!r} in rig {desc['rig_id']}")


# --------------------------------------------------------------------------------------------- down


def _stat_state(pid: int) -> str | None:
    """The process state letter, or None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie (a killed daemon whose parent has not reaped it yet holds nothing)."""
    state = _stat_state(pid)
    return state is not None and state not in ("Z", "X")


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _cmdline(pid: int) -> str:
    """The command line, NULs as spaces (sshd rewrites its own: "sshd: /usr/sbin/sshd -f CONFIG ... [listener] ...")."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").replace("\0", " ")
    except OSError:
        return ""


def _is_sshd(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "sshd"
    except OSError:
        return False


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


def _sshd_pids(config_paths: set[str]) -> set[int]:
    """sshd listeners started with one of these config files (they outlive a namespace whose name was removed)."""
    found = set()
    for pid in _pids():
        if _is_sshd(pid) and any(f"-f {c} " in _cmdline(pid) + " " for c in config_paths):
            found.add(pid)
    return found


def _n_processes(n: int) -> str:
    return f"{n} process" if n == 1 else f"{n} processes"


def _kill(pids: set[int], grace: float = 3.0) -> list[int]:
    """SIGTERM, then SIGKILL after ``grace`` seconds; returns the pids still alive after that."""
    pids = {p for p in pids if p != os.getpid()}
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            pids = {p for p in pids if _alive(p)}
            if not pids:
                return []
            time.sleep(0.02)
    return sorted(p for p in pids if _alive(p))


def teardown(desc: dict, keep_state: bool = False) -> list[str]:
    """Tear down the rig ``desc`` describes; what was removed. Idempotent; raises RigError if anything is left."""
    removed = []
    names = [h["netns"] for h in desc["hosts"]]
    configs = {h["sshd_config"] for h in desc["hosts"]}
    pids = _pids_in_netns(names) | _sshd_pids(configs)
    for h in desc["hosts"]:
        pid = h.get("sshd_pid")
        if pid and _alive(pid) and _is_sshd(pid) and f"-f {h['sshd_config']} " in _cmdline(pid) + " ":
            pids.add(pid)
    if desc.get("slurm"):
        pids |= _slurm_pids(desc["slurm"]["dir"] + "/")
    survivors = _kill(pids)
    if pids:
        removed.append(_n_processes(len(pids) - len(survivors)))
    netns_now, links_now = _names_in_use()
    for h in desc["hosts"]:
        if h["netns"] in netns_now:
            _ip("netns", "del", h["netns"], check=False)
            removed.append(f"netns {h['netns']}")
        if h["veth"] in links_now and _gone_ok(_ip("link", "del", h["veth"], check=False)):
            removed.append(f"veth {h['veth']}")
        etc = Path("/etc/netns") / h["netns"]
        if etc.exists():
            shutil.rmtree(etc, ignore_errors=True)
    if desc["bridge"] in links_now:
        _ip("link", "del", desc["bridge"], check=False)
        removed.append(f"bridge {desc['bridge']}")
    with contextlib.suppress(OSError):
        Path("/etc/netns").rmdir()  # only if empty
    left = leftovers(desc)
    if survivors:
        left.append(f"processes that survived SIGKILL: {survivors}")
    if left:
        raise RigError(f"tearing down rig {desc['rig_id']} left: {'; '.join(left)}")
    if not keep_state:
        _remove_state(desc)
    else:
        desc["status"] = "down"
        _save(desc)
    return removed


def leftovers(desc: dict) -> list[str]:
    """What of the rig still exists: namespaces, links, /etc/netns entries, live sshd or other processes."""
    netns_now, links_now = _names_in_use()
    left = [f"netns {h['netns']}" for h in desc["hosts"] if h["netns"] in netns_now]
    left += [f"link {n}" for n in [desc["bridge"]] + [h["veth"] for h in desc["hosts"]] if n in links_now]
    left += [f"/etc/netns/{h['netns']}" for h in desc["hosts"] if (Path("/etc/netns") / h["netns"]).exists()]
    live = {p for p in _sshd_pids({h["sshd_config"] for h in desc["hosts"]}) if _alive(p)}
    live |= {p for p in _pids_in_netns([h["netns"] for h in desc["hosts"]]) if _alive(p)}
    if desc.get("slurm"):
        live |= {p for p in _slurm_pids(desc["slurm"]["dir"] + "/") if _alive(p)}
    if live:
        left.append(f"processes {sorted(live)}")
    return left


def _remove_state(desc: dict) -> None:
    sdir = Path(desc["state_dir"])
    for h in desc["hosts"]:
        shutil.rmtree(Path(h["sshd_config"]).parent, ignore_errors=True)
    shutil.rmtree(sdir / "bin", ignore_errors=True)
    if desc.get("slurm"):
        shutil.rmtree(desc["slurm"]["dir"], ignore_errors=True)
    for name in _OWN_FILES:
        (sdir / name).unlink(missing_ok=True)
    (sdir / "rig.tmp").unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        sdir.rmdir()  # only if empty: a --state directory may hold other files


def down(state_dir: str | os.PathLike | None = None, *, prefix: str | None = None,
         base: str | os.PathLike = DEFAULT_BASE, keep_state: bool = False) -> list[str]:
    """Tear down the rig recorded in ``state_dir``, and/or every rig whose names start with ``prefix``.

    Harmless when there is nothing to tear down. Returns what was removed; raises RigError if anything is left.
    """
    if state_dir is None and prefix is None:
        raise ValueError("say which rig: a state directory, or a name prefix")
    removed: list[str] = []
    if state_dir is not None:
        desc = load(state_dir)
        if desc is not None:
            removed += teardown(desc, keep_state=keep_state)
    if prefix is not None:
        if not _PREFIX_RE.fullmatch(prefix) and not re.fullmatch(r"[a-z][a-z0-9]{0,10}", prefix):
            raise ValueError(f"not a rig prefix: {prefix!r}")
        removed += _sweep(prefix, Path(base), keep_state)
    with contextlib.suppress(OSError):
        Path(base).rmdir()  # only if empty
    return removed


def _sweep(prefix: str, base: Path, keep_state: bool) -> list[str]:
    """Remove, by name, every rig whose names start with ``prefix`` (state recorded under ``base`` or not)."""
    removed = []
    if base.is_dir():
        for sdir in sorted(base.iterdir()):
            desc = load(sdir) if sdir.name.startswith(prefix) else None
            if desc is not None:
                removed += teardown(desc, keep_state=keep_state)
    p = re.escape(prefix)
    ns_re = re.compile(rf"{p}[0-9a-z]*-(?:h\d+|probe)")
    link_re = re.compile(rf"{p}[0-9a-z]*(?:br|v\d+|pb|pv)")
    netns_now, links_now = _names_in_use()
    ours_ns = sorted(n for n in netns_now if ns_re.fullmatch(n))
    cfg_re = re.compile(rf"-f \S*/{p}[0-9a-z]*-h\d+/sshd_config ")
    sshds = {pid for pid in _pids() if _is_sshd(pid) and cfg_re.search(_cmdline(pid) + " ")}
    pids = _pids_in_netns(ours_ns) | sshds | _slurm_pids(re.compile(rf"/{p}[0-9a-z]*-slurm/"))
    survivors = _kill(pids)
    if pids:
        removed.append(_n_processes(len(pids) - len(survivors)))
    for ns in ours_ns:
        _ip("netns", "del", ns, check=False)
        removed.append(f"netns {ns}")
    for link in sorted(n for n in links_now if link_re.fullmatch(n)):
        if _gone_ok(_ip("link", "del", link, check=False)):
            removed.append(f"link {link}")
    etc = Path("/etc/netns")
    if etc.is_dir():
        for d in etc.iterdir():
            if ns_re.fullmatch(d.name):
                shutil.rmtree(d, ignore_errors=True)
        with contextlib.suppress(OSError):
            etc.rmdir()  # only if empty
    netns_now, links_now = _names_in_use()
    left = [n for n in netns_now if ns_re.fullmatch(n)] + [n for n in links_now if link_re.fullmatch(n)]
    if survivors:
        left.append(f"processes that survived SIGKILL: {survivors}")
    if left:
        raise RigError(f"tearing down rigs {prefix}* left: {', '.join(left)}")
    return removed


# --------------------------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="build a rig and print its description (JSON)")
    p_up.add_argument("--hosts", type=int, default=2, help="number of hosts (default 2)")
    p_up.add_argument("--state", help="state directory (default /run/wbrig/<rig id>)")
    p_up.add_argument("--prefix", default=DEFAULT_PREFIX, help="name prefix of namespaces, links and rig id (default wbrig)")
    p_up.add_argument("--subnet", help="IPv4 subnet, e.g. 198.18.0.0/24 (default: the first free /24 of 198.18.0.0/15)")
    p_up.add_argument("--port", type=int, default=22, help="sshd port on each host (default 22)")
    p_up.add_argument("--python", default=None, help="the python the hosts run (default: this one)")
    p_up.add_argument("--no-uts", action="store_true", help="hosts keep this machine's hostname")
    p_up.add_argument("--no-verify", action="store_true", help="skip the ssh + python + host-to-host check")
    p_up.add_argument("--install-sshd", action="store_true", help="apt-get install openssh-server if sshd is missing")
    p_up.add_argument("--slurm", action="store_true", help="also a Slurm cluster: munged, slurmctld on the head, a slurmd "
                      "per host (needs slurm-wlm and munge); clients use SLURM_CONF=<the description's slurm.conf>")
    p_up.add_argument("--foreground", action="store_true", help="stay running and tear down on exit (Ctrl-C, SIGTERM)")
    p_up.add_argument("--timeout", type=float, default=30.0, help="seconds for sshd to come up and answer (default 30)")
    p_down = sub.add_parser("down", help="tear a rig down (idempotent)")
    p_down.add_argument("--state", help="the rig recorded in this state directory")
    p_down.add_argument("--prefix", help="every rig whose names start with this prefix (by name, even without state)")
    p_down.add_argument("--keep-state", action="store_true", help="keep the state directory (logs, keys)")
    p_status = sub.add_parser("status", help="print a rig's description and what of it exists")
    p_status.add_argument("--state", required=True)
    sub.add_parser("check", help="exit 0 if the rig can be built here, else 2 and the reason")
    args = ap.parse_args(argv)

    try:
        if args.cmd == "check":
            check_support()
            print("ok: the multi-host rig can be built here")
            return 0
        if args.cmd == "status":
            desc = load(args.state)
            if desc is None:
                print(f"no rig recorded in {args.state}", file=sys.stderr)
                return 1
            print(json.dumps(dict(desc, exists=leftovers(desc)), indent=2))
            return 0
        if args.cmd == "down":
            if args.state is None and args.prefix is None:
                ap.error("down needs --state DIR or --prefix PREFIX")
            removed = down(args.state, prefix=args.prefix, keep_state=args.keep_state)
            print("removed: " + (", ".join(removed) if removed else "nothing (no such rig)"))
            return 0
        if args.install_sshd:
            install_sshd()
        t0 = time.perf_counter()
        desc = up(args.hosts, args.state, prefix=args.prefix, subnet=args.subnet, port=args.port,
                  python=args.python, uts=not args.no_uts, verify=not args.no_verify, timeout=args.timeout,
                  slurm=args.slurm)
        if args.foreground:
            atexit.register(_quiet_down, desc)
        print(json.dumps(desc, indent=2), flush=True)
        print(f"rig {desc['rig_id']} up in {time.perf_counter() - t0:.2f} s: {len(desc['hosts'])} hosts in {desc['subnet']}; "
              f"ssh -F {desc['ssh_config']} {desc['hosts'][0]['address']}"
              + (f"; Slurm: export SLURM_CONF={desc['slurm']['conf']}; sinfo" if desc.get("slurm") else "") + "; "
              + ("Ctrl-C to tear down" if args.foreground else f"tear down: {sys.argv[0]} down --state {desc['state_dir']}"),
              file=sys.stderr, flush=True)
        if args.foreground:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGINT too: ignored by default in background jobs
                signal.signal(sig, lambda *_: sys.exit(0))
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    signal.pause()
        return 0
    except RigUnavailable as e:
        print(f"the multi-host rig cannot be built here: {e}", file=sys.stderr)
        return 2
    except RigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1

"""sshd on the rig: one sshd per host inside its namespace, the rig's client key, known_hosts and
ssh_config, the check that every host answers over ssh, and running commands on a host."""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
import subprocess
import time
from pathlib import Path

from .errors import RigError, RigUnavailable
from .procs import _alive, _cmdline, _pids, _read_pid, _run, _tail, _tool
from .state import _save

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


def _is_sshd(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "sshd"
    except OSError:
        return False


def _sshd_pids(config_paths: set[str]) -> set[int]:
    """sshd listeners started with one of these config files (they outlive a namespace whose name was removed)."""
    found = set()
    for pid in _pids():
        if _is_sshd(pid) and any(f"-f {c} " in _cmdline(pid) + " " for c in config_paths):
            found.add(pid)
    return found

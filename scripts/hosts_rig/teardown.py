"""Tearing a rig down: every process in its namespaces (sshd, sessions, engines) and its Slurm, then its
namespaces, veths and bridge; by its state directory, or by name when even the state is lost."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from pathlib import Path

from .errors import RigError
from .net import _PREFIX_RE, _gone_ok, _ip, _names_in_use, _pids_in_netns
from .procs import _alive, _cmdline, _kill, _n_processes, _pids
from .slurm import _slurm_pids
from .sshd import _is_sshd, _sshd_pids
from .state import _OWN_FILES, DEFAULT_BASE, _save, load

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


def _quiet_down(desc: dict) -> str | None:
    try:
        teardown(desc)
    except Exception as e:  # noqa: BLE001 - reported alongside the original error
        return str(e)
    return None

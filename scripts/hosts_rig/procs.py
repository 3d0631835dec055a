"""Processes: commands run with a timeout, finding processes in /proc, and ending them (TERM, then KILL).

Every command the rig runs goes through ``_run``, which bounds it (``CMD_TIMEOUT_S`` seconds unless told)
and turns a timeout or a failure into a RigError that quotes the command.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

from .errors import RigError

CMD_TIMEOUT_S = 10.0


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

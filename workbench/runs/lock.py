"""One writer per run folder: an exclusive ``flock`` on ``<run>/.lock``, held by the process that owns the run.

The kernel releases a ``flock`` when its owner dies, however it dies (SIGKILL included), so a lock that
can be taken means no live process owns the run: a record still marked ``"running"`` is stale. The lock
file also holds the owner's pid and host, so a refusal can name them. The descriptor is not inherited
by child processes (Python opens files non-inheritable), so engines started by the owner never hold it.
POSIX only (``fcntl``); on a network file system the lock is only as good as its ``flock``.
:func:`try_flock` is the same lock for any file (``build --out`` holds one, see :mod:`workbench.publish.buildlog`).
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path

LOCK_FILE = ".lock"


class RunLocked(RuntimeError):
    """Another live process owns the run; ``run_id``, ``pid`` and ``host`` name it."""

    def __init__(self, run_id: str, pid: int | None, host: str | None):
        owner = f"process {pid} on {host}" if pid is not None else "another process (pid unknown)"
        super().__init__(f"Run '{run_id}' is already being written by {owner}. Wait for it to end, or stop "
                         f"that process; a second writer would mix two runs' steps.")
        self.run_id, self.pid, self.host = run_id, pid, host


@dataclass(frozen=True)
class Owner:
    """Who holds a run's lock: ``pid`` on ``host``."""

    pid: int
    host: str

    def as_dict(self) -> dict:
        return {"pid": self.pid, "host": self.host}


def this_process() -> Owner:
    return Owner(pid=os.getpid(), host=socket.gethostname())


class RunLock:
    """The lock of one run folder. :meth:`acquire` takes it or raises :class:`RunLocked` at once."""

    def __init__(self, folder: Path, run_id: str):
        self.path, self.run_id, self.fd = Path(folder) / LOCK_FILE, run_id, None

    @property
    def held(self) -> bool:
        return self.fd is not None

    def acquire(self) -> "RunLock":
        """Take the lock without waiting and record this process as its owner.

        Raises:
            RunLocked: a live process holds it (named from the lock file).
        """
        if self.fd is None:
            self.fd = try_flock(self.path, this_process().as_dict())
            if self.fd is None:
                owner = read_owner(self.path)
                raise RunLocked(self.run_id, owner.pid if owner else None, owner.host if owner else None)
        return self

    def release(self) -> None:
        """Let go of the lock (idempotent); closing the descriptor releases the ``flock``."""
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        self.release()


def try_flock(path: Path, record: dict) -> int | None:
    """Take an exclusive ``flock`` on the file ``path`` (made if missing) without waiting, and write
    ``record`` into it as JSON, for a refusal to name the holder.

    Returns:
        The descriptor that holds the lock (closing it, or the process ending, lets go), or None when
        another live process holds it.
    """
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:  # held (BlockingIOError), or no locks here (ENOLCK on some NFS): no fd leaks
        os.close(fd)
        if isinstance(err, BlockingIOError):
            return None
        raise
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_record(path: Path) -> dict | None:
    """The JSON object :func:`try_flock` wrote into a lock file, or None (none yet, unreadable, not JSON)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_owner(path: Path) -> Owner | None:
    """The owner recorded in a lock file, or ``None`` when it holds none (yet)."""
    data = read_record(path)
    try:
        return Owner(pid=int(data["pid"]), host=str(data["host"]))
    except (KeyError, TypeError, ValueError):
        return None

"""A rig's state directory: its description (``rig.json``), written before anything is built, and the
lock that keeps concurrent ``up``s from picking the same id or subnet."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path

from .errors import RigError

DEFAULT_BASE = Path(os.environ.get("WBRIG_BASE", "/run/wbrig"))  # tmpfs: state lives as long as the namespaces
STATE_FILE = "rig.json"
_OWN_FILES = ("rig.json", "id_ed25519", "id_ed25519.pub", "authorized_keys", "known_hosts", "ssh_config")
_LOCK_PATH = Path("/run/lock/wbrig-rig.lock") if Path("/run/lock").is_dir() else Path("/tmp/wbrig-rig.lock")


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


def _current_user() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name

"""Files written so that a reader, or a crash, sees the old file or the new one, never part of one: a
temporary file beside the target, fsynced, then ``os.replace``. A run's record (:mod:`workbench.runs.store`)
and every output of a build (:mod:`workbench.publish`) go through :func:`write_atomic`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


class WriteError(OSError):
    """An output could not be written (a full disk, say). ``filename`` names it, ``errno`` says why; whatever
    was at that path before is left as it was (``kept`` tells whether there was a file)."""

    def __init__(self, path: Path, err: OSError, kept: bool):
        super().__init__(err.errno, err.strerror or str(err), str(path))
        self.kept = kept

    def __str__(self) -> str:
        return (f"could not write {self.filename}: {self.strerror}"
                + (" (the earlier file there is kept)" if self.kept else " (nothing was left there)"))


def temp_beside(path: Path) -> Path:
    """A fresh hidden name in ``path``'s folder with ``path``'s suffix (writers such as kaleido read the
    format from it): where an output is written before :func:`replace_atomic` puts it in place."""
    return path.with_name(f".{path.stem}.{os.getpid()}-{secrets.token_hex(4)}.tmp{path.suffix}")


def fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):  # makes the rename itself durable (POSIX only)
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def replace_atomic(tmp: Path, path: Path, *, shown: Path | None = None) -> Path:
    """Flush ``tmp`` (a file written beside ``path``) to disk and rename it over ``path``: a reader, or a
    crash, sees the old file or the new one, never part of one. ``tmp`` is removed whatever happens.
    Returns ``shown`` (the name the caller gave, default ``path``).

    Raises:
        WriteError: naming ``shown``, when the flush or the rename fails.
    """
    shown = Path(path if shown is None else shown)
    try:
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        raise WriteError(shown, err, kept=Path(path).is_file()) from err
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    fsync_dir(Path(path).parent)
    return shown


def write_atomic(path: Path | str, data: str | bytes) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` through a temporary file in the same folder, fsync and
    ``os.replace``: on a full disk the file at ``path`` is the earlier one, intact, or none, never a
    truncated one. A symlink is followed (its target is replaced); an existing file keeps its mode,
    a new one gets ``0o666`` less the umask. Returns ``path`` as given.

    Raises:
        WriteError: naming ``path``, with the reason (``errno.ENOSPC``: no space left on the device).
    """
    shown, target = Path(path), Path(os.path.realpath(path))
    body = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    tmp = temp_beside(target)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as f:
            with contextlib.suppress(FileNotFoundError):
                os.fchmod(f.fileno(), target.stat().st_mode & 0o7777)
            f.write(body)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise WriteError(shown, err, kept=target.is_file()) from err
    return replace_atomic(tmp, target, shown=shown)


__all__ = ["WriteError", "fsync_dir", "replace_atomic", "temp_beside", "write_atomic"]

"""An engine's output: where it goes while the engine runs, and what it said before it died.

ipykernel's ``OutStream`` (the engine's ``sys.stdout`` / ``sys.stderr``) also captures the process's
file descriptors 1 and 2 by default: native code's writes (an MLX ``[ring] Couldn't connect``, a C++
abort's message) go into a pipe that a thread of the engine reads and echoes to the real descriptor.
An engine that aborts right after writing loses the line whenever that thread has not run yet (under
load it often has not), and the run's error then quoted an empty log (issue 14's flaky test). With
:class:`DirectFdOutStream` the descriptors stay the engine's log file, written before the process can
exit, while ``print`` still reaches the notebook as before.

Python's own writes are buffered in the ``OutStream`` and sent by its I/O thread; a process that ends
by ``os._exit`` or a signal right after ``print`` lost them (issue 24). :class:`DirectFdOutStream` also
writes each one to the log file before ``write`` returns, and ``faulthandler`` writes the Python stack
of a crash (SIGSEGV, SIGBUS, SIGABRT) there. :func:`exit_status` and :func:`last_words` read the death
back in the driver: how the process ended, and the last lines of its log once it has ended.
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
from typing import Any

from ipykernel.iostream import OutStream

#: The engine option that installs it (every launcher passes it to ``ipyparallel.engine``).
ENGINE_ARG = f"--IPEngine.out_stream_factory={__name__}.DirectFdOutStream"


class _FdWriter:
    """A write-through file on a descriptor (what ``OutStream`` echoes to): no buffer to lose."""

    def __init__(self, fd: int):
        self.fd = fd

    def write(self, text: str) -> int:
        data = text.encode("utf-8", "replace")
        try:
            while data:
                data = data[os.write(self.fd, data):]
        except OSError:  # the log is gone (a closed pipe, a full disk): the print itself must still work
            pass
        return len(text)

    def read(self, *args):  # ``OutStream`` takes an echo only if it looks like a file
        raise OSError("write-only")

    def flush(self) -> None:
        pass

    def fileno(self) -> int:
        return self.fd


class DirectFdOutStream(OutStream):
    """``OutStream`` without file-descriptor capture (``watchfd=False``) that also writes every ``print``
    straight to its descriptor (the engine's log), and arms ``faulthandler`` there (stderr only)."""

    def __init__(self, session, pub_thread, name, *args, **kwargs):
        kwargs["watchfd"] = False
        fd = 2 if name == "stderr" else 1
        kwargs["echo"] = _FdWriter(fd)
        super().__init__(session, pub_thread, name, *args, **kwargs)
        if name == "stderr":
            try:
                faulthandler.enable(file=fd, all_threads=False)  # the thread that crashed is the one to see
            except (OSError, ValueError, RuntimeError):  # no usable fd 2: the engine runs on without it
                pass


#: What a signal that ends an engine usually means.
SIGNAL_HINTS = {"SIGSEGV": "a crash in native code", "SIGBUS": "a memory-mapped file cut short while in use?",
                "SIGABRT": "an abort in native code", "SIGKILL": "out of memory, or killed by another process",
                "SIGFPE": "an arithmetic fault in native code", "SIGILL": "an illegal instruction in native code"}


def describe_exit(code: int | None) -> str:
    """``"exit code 3"``, ``"killed by SIGSEGV (a crash in native code)"``, or ``"exit status unknown"``.

    Args:
        code: As ``psutil`` / ``subprocess`` give it: the exit code, or minus the signal that ended it.
    """
    if code is None:
        return "exit status unknown"
    if int(code) >= 0:
        return f"exit code {int(code)}"
    try:
        name = signal.Signals(-int(code)).name
    except ValueError:
        name = f"signal {-int(code)}"
    return f"killed by {name}" + (f" ({SIGNAL_HINTS[name]})" if name in SIGNAL_HINTS else "")


def is_local_engine(launcher: Any) -> bool:
    """An engine started on this machine by ipyparallel's local launcher (not imported: engines load this module)."""
    return any(cls.__name__ == "LocalEngineLauncher" for cls in type(launcher).__mro__)


def exit_status(launcher: Any, wait_s: float) -> tuple[bool, int | None]:
    """(ended, code) of the engine process of ipyparallel's local ``launcher``, waiting up to ``wait_s``.

    ipyparallel's waiting thread reaps the process and ``psutil`` keeps its status; that thread is joined
    rather than raced (a second waiter would find no child and get no status). ``code`` is ``None`` when
    it is not known: a remote engine, or one this process did not start.
    """
    process = getattr(launcher, "process", None)
    if process is None or not is_local_engine(launcher):  # an ssh launcher's process is its ssh client
        return False, None
    waiter = getattr(launcher, "_wait_thread", None)
    if waiter is not None:
        waiter.join(wait_s)
    try:
        return True, process.wait(0 if waiter is not None else wait_s)
    except Exception:  # psutil.TimeoutExpired: still running
        return False, None


def read_output(launcher: Any, max_bytes: int = 65536) -> str:
    """The last ``max_bytes`` of an engine launcher's output, decoded leniently (a crash can write bytes
    that are not UTF-8; ipyparallel's own reader raised on them and the run's error quoted nothing)."""
    path = getattr(launcher, "output_file", "")
    if path and is_local_engine(launcher):
        try:
            with open(path, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - max_bytes))
                return f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            pass  # ipyparallel's loop noticed the exit: it read the file into the launcher, then removed it
    try:
        return launcher.get_output() or ""  # a remote launcher fetches its engine's file
    except Exception:
        return ""


def keep_output_decodable(launcher: Any) -> None:
    """Hand ipyparallel's local engine ``launcher`` its output read leniently, before its cluster stops.

    ipyparallel reads a stopped engine's log strictly as UTF-8; a crash's stray bytes raised there, which
    cut the cluster's stop short and left the log and the cluster file behind. A read it already made is kept.
    """
    if is_local_engine(launcher) and getattr(launcher, "_output", None) is None:
        launcher._output = read_output(launcher)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: ipyparallel's own log lines below ERROR (registration, "Handling apply_request", the nanny's "Parent
#: exited"): they would push the engine's last words out of the tail.
_CHATTER = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \[(IPEngine|KernelNanny)[^\]]*\](?! (ERROR|CRITICAL) \|)")
_FRAME = re.compile(r"^\s+File \"")
KEPT_FRAMES = 6


def last_words(text: str, num_lines: int = 25, line_chars: int = 300) -> str:
    """The last ``num_lines`` lines of an engine's output that the engine (or its code) wrote.

    ipyparallel's chatter is dropped, a ``faulthandler`` stack keeps its innermost :data:`KEPT_FRAMES`
    frames, and each line is cut at ``line_chars`` characters (its "Extension modules:" line runs long).
    """
    lines, frames = [], 0
    for line in _ANSI.sub("", text).splitlines():
        if _CHATTER.match(line):
            continue
        frames = frames + 1 if _FRAME.match(line) else 0
        if frames > KEPT_FRAMES:  # one line says how many outer frames were left out
            note = f"  ... ({frames - KEPT_FRAMES} outer frames)"
            lines[-1:] = [note] if frames > KEPT_FRAMES + 1 else [lines[-1], note]
            continue
        lines.append(line if len(line) <= line_chars else line[:line_chars] + " ...")
    return "\n".join(lines[-num_lines:]).strip()

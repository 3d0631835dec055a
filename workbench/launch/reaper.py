"""No engine outlives its driver: a small watcher process that kills what the driver started when it dies.

``EngineRun.stop`` stops engines and controller when a run ends, fails or is interrupted; it cannot run
when the driver itself is killed (SIGKILL, or SIGTERM, whose default action skips every ``finally``).
Issue 14 found the controller with its 8 children, both engines and both nannies alive minutes later,
still training and appending steps. So :func:`start_reaper` starts ``python -m workbench.launch.reaper``
in its own session (a signal to the driver's process group spares it), connected to the driver by a
pipe. The driver tells it each process it starts and each file to remove; when the pipe closes
without a ``release`` (the driver died, however) or the reaper's parent changes, it SIGKILLs every
registered process with all its descendants and process group (busy engines ignore SIGTERM), removes
the files, and exits. Measured on 2 cores: everything gone within a second of the driver's SIGKILL.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any


@dataclass
class Reaper:
    """The driver's end of the pipe to a reaper process."""

    process: subprocess.Popen

    def _send(self, message: dict[str, Any]) -> None:
        try:
            self.process.stdin.write(json.dumps(message) + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):  # the reaper is gone: nothing to tell
            pass

    def watch(self, pid: int) -> None:
        """Kill ``pid`` (its process group and descendants too) if the driver dies."""
        self._send({"watch": int(pid)})

    def remove_on_death(self, path: str) -> None:
        """Remove ``path`` if the driver dies (the controller's ``cluster-*.json``)."""
        self._send({"file": str(path)})

    def release(self) -> None:
        """The driver stopped everything itself: the reaper exits and kills nothing (idempotent)."""
        if self.process.stdin.closed:
            return
        self._send({"release": True})
        try:
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()


def start_reaper() -> Reaper:
    """Start a reaper watching this process (see the module docstring)."""
    process = subprocess.Popen([sys.executable, "-m", "workbench.launch.reaper", str(os.getpid())],
                               stdin=subprocess.PIPE, text=True, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return Reaper(process)


def kill_trees(pids: list[tuple[int, float]]) -> None:
    """SIGKILL each ``(pid, create_time)`` still alive, its descendants and the process group it leads.

    The whole tree is collected before anything is killed (a killed parent's children are reparented
    and could no longer be found through it). The create time guards against a recycled pid.
    """
    import psutil

    victims: dict[int, Any] = {}
    for pid, created in pids:
        try:
            proc = psutil.Process(pid)
            if abs(proc.create_time() - created) > 0.01:
                continue
            for p in [proc, *proc.children(recursive=True)]:
                victims[p.pid] = p
        except psutil.Error:
            continue
    groups = {pid for pid, _ in pids if pid in victims}
    for pid in groups:  # the controller's children share its process group
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    for p in victims.values():
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass


def main(driver_pid: int) -> None:
    import psutil

    watched: list[tuple[int, float]] = []
    files: list[str] = []
    buffer = ""
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], 0.5)
        if os.getppid() != driver_pid:  # the driver died, though its pipe lives on in some inheritor
            break
        if not ready:
            continue
        chunk = os.read(sys.stdin.fileno(), 65536).decode()
        if not chunk:  # EOF: the driver died (or closed the pipe without a release)
            break
        buffer += chunk
        *lines, buffer = buffer.split("\n")
        for line in lines:
            message = json.loads(line)
            if message.get("release"):
                return
            if "watch" in message:
                try:
                    watched.append((message["watch"], psutil.Process(message["watch"]).create_time()))
                except psutil.Error:
                    pass
            if "file" in message:
                files.append(message["file"])
    kill_trees(watched)
    for path in files:
        try:
            os.remove(path)
        except OSError:
            pass


if __name__ == "__main__":
    main(int(sys.argv[1]))

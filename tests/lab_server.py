"""A real JupyterLab for the tests: on 127.0.0.1 at a free port, with its own folders, stopped with its kernels."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_jupyterlab(root: Path, home: Path, *, token: str = "", env: dict | None = None, args: tuple = (),
                       start_timeout_s: float = 120):
    """Yields the server's URL once ``/api/status`` answers; its log is ``home/jupyterlab.log``.

    ``root`` is the server's root folder; ``home`` holds its config, runtime and data folders. Where it does
    not start in ``start_timeout_s`` (or exits), RuntimeError carries the log's tail. On exit a clean
    shutdown (which stops the kernels it started), else its process group is killed.
    """
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
           "JUPYTER_DATA_DIR": str(home / "data"), **(env or {})}
    cmd = [sys.executable, "-m", "jupyterlab", "--allow-root", "--no-browser", f"--IdentityProvider.token={token}",
           "--ServerApp.password=", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
           "--ServerApp.port_retries=0", f"--ServerApp.root_dir={root}", "--LabApp.news_url=None",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", *args]
    url, headers = f"http://127.0.0.1:{port}", {"Authorization": f"token {token}"} if token else {}
    with open(home / "jupyterlab.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            deadline = time.monotonic() + start_timeout_s
            while True:
                try:
                    urllib.request.urlopen(urllib.request.Request(f"{url}/api/status", headers=headers), timeout=5)
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"JupyterLab did not start:\n{(home / 'jupyterlab.log').read_text()[-3000:]}")
                    time.sleep(0.5)
            yield url
        finally:
            try:
                urllib.request.urlopen(urllib.request.Request(f"{url}/api/shutdown", method="POST", headers=headers),
                                       timeout=10)
                proc.wait(timeout=20)
            except (OSError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)

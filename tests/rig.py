"""The multi-host rig (scripts/hosts_rig.py) as pytest fixtures.

A test module that needs hosts declares ``pytest_plugins = ["rig"]`` (one session-wide rig, however
many modules ask) and requests ``multihost_rig``: the rig's description, a dict with ``hosts`` (each
with ``address``, ``port``, ``user``, ``python``, ``hostname``, ``netns``, ``veth``), ``head_address``
(the root namespace on the rig's bridge), ``ssh_config``, ``key`` and ``state_dir``. ``rig_or_skip(n)``
builds a private rig for a test that breaks it (``rig_or_skip(2, slurm=True)``: with Slurm, see
``desc["slurm"]``). Where the rig cannot be built here (not root, no
iproute2, no network namespaces, no sshd), the tests are reported as skipped with the reason; a rig
that can be built but fails is an error. The rig is torn down when the fixture ends, also after a
failed test.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_hosts_rig():
    if "hosts_rig" in sys.modules:
        return sys.modules["hosts_rig"]
    spec = importlib.util.spec_from_file_location("hosts_rig", ROOT / "scripts" / "hosts_rig.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["hosts_rig"] = module
    spec.loader.exec_module(module)
    return module


hosts_rig = _load_hosts_rig()


@contextlib.contextmanager
def rig_or_skip(n_hosts: int = 2, **kwargs):
    """A rig of ``n_hosts`` for the ``with`` block, always torn down; skips the test if it cannot be built here."""
    try:
        desc = hosts_rig.up(n_hosts, **kwargs)
    except hosts_rig.SlurmUnavailable as e:  # up(..., slurm=True): slurm-wlm or munge missing, or a daemon failed
        pytest.skip(f"Slurm on the multi-host rig cannot run here: {e}")
    except hosts_rig.RigUnavailable as e:
        pytest.skip(f"multi-host rig cannot be built here: {e}")
    try:
        yield desc
    finally:
        hosts_rig.down(desc["state_dir"])


@pytest.fixture(scope="session")
def multihost_rig():
    """A 2-host rig shared by the session."""
    with rig_or_skip(2) as desc:
        yield desc


def ssh(desc: dict, host, command, timeout: float = 60.0, check: bool = True):
    """Run ``command`` (a list, quoted for the remote shell, or a shell string) on ``host`` over the rig's ssh."""
    return hosts_rig.ssh(desc, host, command, timeout=timeout, check=check)

"""The multi-host rig (the package scripts/hosts_rig) as pytest fixtures.

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
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "scripts") not in sys.path:  # the rig is a tool beside the product, not part of it
    sys.path.append(str(ROOT / "scripts"))

import hosts_rig  # noqa: E402 - once scripts/ is on the path


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

"""Test-wide settings, set at import time (before any test imports a framework or starts a kernel).

* ``WORKBENCH_SMALL=1``: notebooks run in their small (CI) configuration; the kernels
  nbval starts inherit it.
* JAX on CPU emulates 8 devices, so single-process tests can run sharded steps on a
  real ``Mesh``; this must be fixed before JAX initialises its backend.
"""

import os

os.environ.setdefault("WORKBENCH_SMALL", "1")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

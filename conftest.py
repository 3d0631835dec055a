"""Test-wide settings, set at import time (before any test imports a framework or starts a kernel).

* ``WORKBENCH_SMALL=1``: notebooks run in their small (CI) configuration; the kernels
  nbval starts inherit it.
* JAX on CPU emulates 8 devices, so single-process tests can run sharded steps on a
  real ``Mesh``; this must be fixed before JAX initialises its backend.
* The tests' own JAX programs are compiled with LLVM's optimizations off
  (``--xla_backend_optimization_level=0``): they check what a step computes and which
  collectives it issues, on arrays of kilobytes, and XLA's buffer plan does not depend on it.
  The single-process tests took 259 CPU-s instead of 299. Ranks, profiles and benchmarks set
  their own ``XLA_FLAGS`` (``workbench.launch.plan``), so what they time is compiled as a
  user's run is.
"""

import os

os.environ.setdefault("WORKBENCH_SMALL", "1")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

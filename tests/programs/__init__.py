"""Programs the tests start on real ranks, one process each: checks, not the product, so they live here.

A test launches one as a module, ``python -m programs.<name>``, through the workbench's own launcher
(:func:`workbench.launch.local_run.run_worker` or :func:`~workbench.launch.local_run.run_local`), with a plan whose
ranks find this folder (:func:`rank_env`)::

    run_worker(plan_launch(2, framework="mlx", backend="ring", env=rank_env()), "programs.mlx_fsdp_check", out)

Tests import from them too (``from programs.jax_fsdp_check import CONFIGS``): pytest puts ``tests/`` on
``sys.path``. What the product itself needs (the benchmark MLPs, JAX's distributed start) is in the package.
"""

import os
from pathlib import Path

#: The folder that holds this package (``tests/``).
TESTS_DIR = Path(__file__).resolve().parents[1]


def rank_env() -> dict[str, str]:
    """The environment for :func:`workbench.launch.plan.plan_launch` (``env=``) whose ranks run
    ``-m programs.<name>``: ``PYTHONPATH`` with ``tests/`` and the checkout first (so the ranks import this
    checkout's ``workbench`` whether or not it is installed), then whatever this process had."""
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {"PYTHONPATH": os.pathsep.join([str(TESTS_DIR), str(TESTS_DIR.parent), *inherited])}

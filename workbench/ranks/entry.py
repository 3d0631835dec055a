"""The function every engine runs for a training run: one rank, MLX or JAX, by the spec's framework.

The driver (:mod:`workbench.launch.driver`) sends :func:`train_rank` to engines by its module path,
so it lives here, below the driver, and imports only downward.
"""

from __future__ import annotations

from pathlib import Path

from workbench.ranks.train_mlx import train_mlx
from workbench.runs.spec import RunSpec
from workbench.runs.store import RunStore


def train_rank(spec_dict: dict, runs_root: str, run_id: str) -> dict:
    """One rank of a run (executed on an engine whose environment comes from the launch plan)."""
    spec = RunSpec(**spec_dict)
    handle = RunStore(Path(runs_root)).open(run_id)
    if spec.framework == "mlx":
        return train_mlx(spec, handle)
    from workbench.ranks.train_jax import train_jax

    return train_jax(spec, handle)

"""The function every engine runs for a training run: one rank, MLX or JAX, by the spec's framework.

The driver (:mod:`workbench.launch.driver`) sends :func:`train_rank` to engines by its module path,
so it lives here, below the driver, and imports only downward.
"""

from __future__ import annotations

from pathlib import Path

from workbench.ranks.train_mlx import train_mlx
from workbench.ranks.user_model import use_driver_paths
from workbench.runs.spec import RunSpec
from workbench.runs.store import RunStore


def train_rank(spec_dict: dict, runs_root: str, run_id: str, import_paths: tuple[str, ...] = ()) -> dict:
    """One rank of a run (executed on an engine whose environment comes from the launch plan).

    ``import_paths``: the driver's working directory and the repository root
    (:func:`workbench.runs.factory.import_paths`), put on ``sys.path`` before the spec is rebuilt, so a
    user's ``model_factory`` imports here as it did in the driver, and its relative ``data`` path means
    the same file.
    """
    use_driver_paths(list(import_paths))
    spec = RunSpec(**spec_dict)
    handle = RunStore(Path(runs_root)).open(run_id)
    if spec.framework == "mlx":
        return train_mlx(spec, handle)
    from workbench.ranks.train_jax import train_jax

    return train_jax(spec, handle)

"""What a rank measures about itself: peak memory, collectives issued, backend capabilities, versions.

Plain data only (ints, dicts): these values travel back from engines and into run records.
"""

from __future__ import annotations

import sys


def peak_rss_bytes() -> int:
    """Peak resident memory of this process in bytes (``ru_maxrss``; psutil's current RSS if unavailable)."""
    try:
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, KiB on Linux
    except (ImportError, OSError):
        import psutil

        return int(psutil.Process().memory_info().rss)


def peak_array_bytes() -> int:
    """Peak bytes of MLX arrays (``mx.get_peak_memory``), since the run started."""
    import mlx.core as mx

    return int(mx.get_peak_memory())


#: Kind of collective -> the key the MLX trainers' ``report`` counts it under (per step, per rank).
COLLECTIVE_KEYS = {"all_reduce": "num_all_sums", "reduce_scatter": "num_reduce_scatters",
                   "all_gather": "num_all_gathers"}


def collective_count(report: dict) -> int:
    """Collectives one rank issued in its last step, from an MLX trainer's ``report``."""
    return int(sum(report.get(key, 0) for key in COLLECTIVE_KEYS.values()))


def tree_nbytes(tree) -> int:
    """Bytes of the MLX arrays in ``tree`` on this rank."""
    from mlx.utils import tree_flatten

    return int(sum(v.nbytes for _, v in tree_flatten(tree)))


def can_split_groups(group) -> bool:
    """Whether the backend can split groups (HSDP); ring cannot."""
    try:
        group.split(0)
        return True
    except RuntimeError:
        return False


def package_versions() -> dict:
    """Installed versions of the packages a run depends on (absent ones left out), for its record."""
    from importlib import metadata

    out = {}
    for dist in ("mlx", "jax", "jaxlib", "flax", "optax", "numpy", "fsdp-workbench"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    if "mlx.core" in sys.modules:  # the BLAS under this process's MLX (workbench.adapters.mlx.blas)
        from workbench.adapters.mlx.blas import blas_in_use

        out["mlx-blas"] = blas_in_use()
    return out

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


#: How a JAX rank's measured peak (``truth_peak``) is read, where the kernel resets the resident high-water mark.
TRUTH_SOURCE = ("one more step's arguments + how far it raised VmHWM above VmRSS (clear_refs), each buffer of a "
                "page or more in pages of its own")


def xla_memory_stats(compiled) -> dict | None:
    """XLA's ``memory_analysis()`` of the compiled step as ``{field: bytes}``, or None if unavailable."""
    try:
        stats = compiled.memory_analysis()
    except Exception:  # not every backend / version implements it (compile errors are not caught here)
        return None
    if stats is None:
        return None
    out = {k: int(getattr(stats, k)) for k in dir(stats) if k.endswith("_in_bytes") and not k.startswith("_")}
    return out or None


def jax_device_bytes(tree) -> int:
    """Bytes of this process's one device's shard of every array in ``tree``."""
    import jax

    return int(sum(leaf.addressable_shards[0].data.nbytes for leaf in jax.tree_util.tree_leaves(tree)))


def jax_measured_memory(params, state, compiled_memory: dict | None, truth: int | None) -> dict:
    """Bytes of this process's shards of the parameters and state; ``peak``, XLA's plan of the step (arguments +
    outputs + temporaries - aliased); and ``truth_peak``, the process's measured peak over one more step after
    the run's (its arguments + how far it raised ``VmHWM``; :data:`TRUTH_SOURCE`), where the kernel resets the
    mark. On the validation LM at 2 ranks, 3 steps, truth read 0.95 of the plan under ddp and 1.00-1.02 under
    fsdp-row and fsdp-flat, on both ranks, and fsdp-full 1.01 on rank 0 and 1.35 on rank 1 (gloo's buffers are
    outside the plan: XLA's CPU reduce-scatter copies its whole input); the first step, whose one-off buffers the
    plan leaves out, measured 16-55% above it."""
    measured = {"parameters": jax_device_bytes(params), "optimizer_state": jax_device_bytes(state)}
    if compiled_memory is not None:  # XLA's buffer plan of the step on this device
        planned = sum(compiled_memory.get(f"{k}_size_in_bytes", 0) for k in ("argument", "output", "temp"))
        measured["peak"] = planned - compiled_memory.get("alias_size_in_bytes", 0)
        measured["peak_source"] = "XLA memory_analysis: arguments + outputs + temporaries - aliased"
    if truth is not None:
        measured.update(truth_peak=truth, truth_source=TRUTH_SOURCE)
    return measured

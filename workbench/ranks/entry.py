"""The function every engine runs for a training run: one rank, MLX or JAX, by the spec's framework (the
phases it reports as it goes: :mod:`workbench.ranks.phases`); and the driver's bounded check of a user's model.

The driver (:mod:`workbench.launch.driver`) sends :func:`train_rank` to engines by its module path,
so it lives here, below the driver, and imports only downward. ``python -m workbench.ranks.entry`` is the
subprocess in which the driver builds a user's model before any engine starts (:func:`check_model_main`),
so that ``timeout_s`` bounds a slow factory and a factory that crashes cannot take the driver with it.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
from pathlib import Path

from workbench.ranks.train_mlx import train_mlx
from workbench.ranks.user_model import use_driver_paths, user_model_spec
from workbench.runs.spec import RunSpec
from workbench.ranks.phases import PHASE_SPEC, report_phase
from workbench.runs.store import RunStore

def train_rank(spec_dict: dict, runs_root: str, run_id: str, import_paths: tuple[str, ...] = (),
               compile_folder: str | None = None) -> dict:
    """One rank of a run (executed on an engine whose environment comes from the launch plan).

    ``import_paths``: the driver's working directory and the repository root
    (:func:`workbench.runs.factory.import_paths`), put on ``sys.path`` before the spec is rebuilt, so a
    user's ``model_factory`` imports here as it did in the driver, and its relative ``data`` path means
    the same file. Rebuilding the spec checks its token file against ``data_sha256``: this rank trains
    on the bytes the driver validated, or fails naming the file. ``compile_folder``: where a JAX run's ranks
    on this machine share their step's compile (:mod:`workbench.ranks.shared_compile`), or None.
    """
    use_driver_paths(list(import_paths))
    handle = RunStore(Path(runs_root)).open(run_id)
    report_phase(handle, PHASE_SPEC)
    spec = RunSpec(**spec_dict)
    drop_last_run(spec.framework)
    if spec.framework == "mlx":
        return train_mlx(spec, handle)
    from workbench.ranks.train_jax import train_jax

    return train_jax(spec, handle, compile_folder)


def drop_last_run(framework: str) -> None:
    """What an earlier run on this engine left (a sweep's :class:`~workbench.launch.pool.EnginePool` hands engines
    on): its objects collected, MLX's buffer cache or JAX's in-memory caches emptied, the C allocator's free pages
    handed back, and the high-water mark of resident memory set to now, so that the peaks this run records are its
    own."""
    import gc

    from workbench.ranks.profile_probe import (GLIBC_MMAP_THRESHOLD_MAX, map_large_allocations, release_free_memory,
                                               reset_high_water_mark)

    gc.collect()
    if framework == "mlx":
        import mlx.core as mx

        mx.clear_cache()
    else:
        if "jax" in sys.modules:  # the last run's compiled steps (the compile caches on disk stay)
            import jax

            jax.clear_caches()
        # A JAX rank measures its peak with glibc's mmap threshold fixed at a page, and fixes it back at the largest
        # a warm process reaches (a fixed threshold ends glibc's own adjustment): every JAX run's timed steps
        # allocate under that threshold, on fresh engines or kept ones, as the profile's timings do.
        map_large_allocations(GLIBC_MMAP_THRESHOLD_MAX)
    release_free_memory()
    reset_high_water_mark()


def check_model_main() -> None:
    """``python -m workbench.ranks.entry``: read a pickled ``(spec, import_paths)`` from stdin, build the
    user's model as an engine would (:func:`~workbench.ranks.user_model.user_model_spec`, in the driver's
    folders), and write a pickled ``("ok", ModelSpec)`` or ``("error", message)`` to stdout. The factory's
    own output goes to stderr; the process exits once it has answered, or as soon as the driver that started it
    is gone."""
    result = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # print() in the factory lands on stderr, never in the result
    parent = os.getppid()

    def orphaned() -> None:
        while os.getppid() == parent:
            time.sleep(0.2)
        os._exit(3)

    threading.Thread(target=orphaned, daemon=True).start()
    spec, paths = pickle.load(sys.stdin.buffer)
    use_driver_paths(list(paths))
    try:
        out = ("ok", user_model_spec(spec))
    except ValueError as err:
        out = ("error", str(err))
    pickle.dump(out, result)
    result.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # done: a thread the factory left running must not keep this process (and the driver) waiting


if __name__ == "__main__":
    check_model_main()

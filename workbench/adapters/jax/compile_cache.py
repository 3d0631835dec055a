"""JAX's persistent compilation cache for the workbench's JAX ranks (issue 25).

Every JAX rank compiles its step before step 0: a few hundred milliseconds to seconds quiet for the models of
the notebooks, several times that on a loaded machine, and the same again for the same model, strategy and
ranks in the next run of a sweep, a rebuilt notebook or another test. With the cache, a program compiled once
on this machine is read back instead: keyed by JAX on the program, the compile options, the devices and
JAX's own version, so the executable read back is the one a compile would make (the tests compare records
of cached and compiled runs, compiled collectives and XLA's memory plan included). On CPU across processes only
rank 0's programs are read back (:func:`compile_cache_state`). Where rank 0 compiles instead, the other ranks
on its machine load its executable (:mod:`workbench.ranks.shared_compile`); where it reads its step back, they
load an earlier run's from the step cache that module keeps in a folder of this one (``steps/``), or compile
theirs where none is kept.

The folder is ``$WORKBENCH_JAX_CACHE``, else ``~/.cache/workbench/jax`` (beside the clusters' files of
:func:`~workbench.launch.cluster_files.cluster_profile_dir`); ``WORKBENCH_JAX_CACHE=off`` compiles every
time. A rank on another host reads that host's own variable and home folder. The cache is bounded
(:data:`MAX_SIZE_BYTES`, least recently used out first), and JAX then guards its folder with a file lock, so
the ranks of one run, which compile the same program at once, never read a half-written entry.
"""

from __future__ import annotations

import os
from pathlib import Path

#: The variable naming the cache folder (``off`` for none).
CACHE_ENV = "WORKBENCH_JAX_CACHE"
#: The values of :data:`CACHE_ENV` that turn the cache off.
OFF = ("off", "0", "none", "false")
#: The cache's bound on disk; the least recently used entries go first beyond it.
MAX_SIZE_BYTES = 2 * 2**30
#: JAX's monitoring events for a compile that looked in the cache, and one the cache answered. (JAX's own
#: "cache_misses" event counts only the entries process 0 writes.)
EVENTS = {"/jax/compilation_cache/compile_requests_use_cache": "requests", "/jax/compilation_cache/cache_hits": "hits"}

_state: dict = {"folder": None, "requests": 0, "hits": 0}
_listening = False


def _count(event: str, **_) -> None:
    if event in EVENTS:
        _state[EVENTS[event]] += 1


def count_cache_events() -> None:
    """Count this process's compiles that looked in a compile cache and those it answered, from now on, whoever
    turned the cache on (registered once; :func:`enable_compile_cache` calls it)."""
    global _listening
    if not _listening:
        import jax.monitoring

        jax.monitoring.register_event_listener(_count)
        _listening = True


def cache_hits() -> int:
    """This process's compiles a compile cache answered since :func:`count_cache_events` (any cache's)."""
    return _state["hits"]


def compile_cache_state() -> dict:
    """``{"folder", "hits", "misses"}``: the cache folder this process uses (None: off, or never enabled), and
    its compiles answered from the cache and compiled since :func:`enable_compile_cache`; what a run records.

    On CPU across processes JAX keys a program by the process's own device and writes entries from process 0
    only, so rank 0 reads its steps back and the other ranks compile theirs (their misses), or load rank 0's
    fresh compile of the step or an earlier run's from the step cache (:mod:`workbench.ranks.shared_compile`;
    counted by neither)."""
    if _state["folder"] is None:  # never enabled here: nothing of this cache's to count
        return {"folder": None, "hits": 0, "misses": 0}
    return {"folder": _state["folder"], "hits": _state["hits"], "misses": _state["requests"] - _state["hits"]}


def compile_cache_dir(environ: dict | None = None) -> Path | None:
    """The cache folder :func:`enable_compile_cache` uses: ``$WORKBENCH_JAX_CACHE`` (``~`` expanded), else
    ``~/.cache/workbench/jax``; None where the variable says :data:`OFF`.

    Raises:
        ValueError: naming ``WORKBENCH_JAX_CACHE`` where it is a relative path or an existing file.
    """
    value = (os.environ if environ is None else environ).get(CACHE_ENV, "").strip()
    if value.lower() in OFF:
        return None
    if not value:
        return Path.home() / ".cache" / "workbench" / "jax"
    path = Path(value).expanduser()
    if not path.is_absolute():
        raise ValueError(f"${CACHE_ENV}={value!r} must be an absolute folder (or 'off'): ranks start in other "
                         "working folders than this one.")
    if path.exists() and not path.is_dir():
        raise ValueError(f"${CACHE_ENV}={value!r} is a file, not a folder.")
    return path


def enable_compile_cache(environ: dict | None = None) -> Path | None:
    """Point this process's JAX at the persistent compilation cache of :func:`compile_cache_dir`; call it
    before the first compile. Every compile is cached however quick (JAX's default keeps only those over 1 s:
    a workbench step compiles in 0.2-2 s quiet and is compiled again run after run).

    Returns:
        The cache folder, or None where the cache is off.

    Raises:
        ValueError: from :func:`compile_cache_dir`.
    """
    path = compile_cache_dir(environ)
    if path is None:
        return None
    import jax

    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    jax.config.update("jax_compilation_cache_max_size", MAX_SIZE_BYTES)
    count_cache_events()
    _state["folder"] = str(path)
    return path

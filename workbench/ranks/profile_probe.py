"""What the two profiling programs share: their command line, their inputs, and the process's real memory.

``python -m workbench.ranks.profile_mlx`` and ``... profile_jax`` (started by
:func:`workbench.launch.profile.profile_model`) read the run's spec from a JSON file, measure the model
at each micro-batch size, and write one JSON object. Where several profile at once (a run's ranks per host),
each is told its peers (``--peers``, ``--peer-index``, ``--peer-dir``): they start measuring together
(:func:`wait_for_peers`), and one done keeps its core busy until all are (:func:`busy_until_peers_done`). The process's resident memory is read from
``/proc/self/status`` (``VmRSS``, ``VmHWM``), and its high-water mark reset by writing ``5`` to
``/proc/self/clear_refs`` (Linux 4.0+); :func:`release_free_memory` first hands the allocator's free pages
back (glibc's ``malloc_trim``) and :func:`map_large_allocations` makes every large buffer pages of its own,
so memory freed by an earlier measurement is touched again, and counted.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import os
import threading
import time
from typing import Any, Callable

import numpy as np

from workbench.core.units import MiB
from workbench.runs.atomic import write_atomic
from workbench.runs.spec import RunSpec


def parse_profile_args(argv: list[str] | None, description: str) -> argparse.Namespace:
    """``--spec FILE`` (a RunSpec's dict, JSON), ``--sizes 2,4,8``, ``--repeats N``, ``--out FILE``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--spec", required=True, help="JSON file of the run's RunSpec.to_dict()")
    parser.add_argument("--sizes", required=True, help="micro-batch sizes, comma-separated, e.g. 2,4,8")
    parser.add_argument("--repeats", type=int, default=2, help="measurements per size (the peak is their max)")
    parser.add_argument("--out", required=True, help="where the JSON result is written")
    parser.add_argument("--peers", type=int, default=1, help="processes profiling at once (a run's ranks per host)")
    parser.add_argument("--peer-index", type=int, default=0, help="this process's index among them")
    parser.add_argument("--peer-dir", default=None, help="a folder the peers share, to start measuring together")
    args = parser.parse_args(argv)
    if args.peers < 1 or not 0 <= args.peer_index < args.peers or (args.peers > 1 and not args.peer_dir):
        parser.error("--peers >= 1, 0 <= --peer-index < --peers, and --peer-dir where --peers > 1")
    try:
        args.sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes {args.sizes!r}: comma-separated integers")
    if not args.sizes or min(args.sizes) < 1 or args.repeats < 1:
        parser.error("--sizes must be integers >= 1 and --repeats >= 1")
    return args


def exit_with_parent() -> None:
    """End this process (status 3) as soon as the process that started it is gone: nothing outlives its owner."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.2)
        os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


def load_spec(path: str) -> RunSpec:
    """The run's spec, rebuilt (and so validated again: a model source changed since is refused)."""
    with open(path, encoding="utf-8") as f:
        return RunSpec(**json.load(f))


def token_batch(spec: RunSpec, micro_batch_size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(inputs, targets)``, ``(b, seq_len)`` int32 tokens below ``vocab_size`` (memory and time do not
    depend on which tokens)."""
    rng = np.random.default_rng(seed + micro_batch_size)
    tokens = rng.integers(0, spec.model["vocab_size"], (micro_batch_size, spec.model["seq_len"] + 1), dtype=np.int32)
    return tokens[:, :-1], tokens[:, 1:]


def status_bytes(field: str) -> int | None:
    """``field`` of ``/proc/self/status`` (``VmRSS``, ``VmHWM``) in bytes; None where there is no such file."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        return None
    return None


def release_free_memory() -> None:
    """Return the C allocator's free pages to the system (glibc's ``malloc_trim(0)``; elsewhere nothing)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


#: glibc's ``mallopt`` parameter for the size from which ``malloc`` maps memory of its own (``M_MMAP_THRESHOLD``).
M_MMAP_THRESHOLD = -3
#: The largest threshold glibc's dynamic rule reaches on 64-bit (``DEFAULT_MMAP_THRESHOLD_MAX``): a warm process's.
GLIBC_MMAP_THRESHOLD_MAX = 32 * MiB


def map_large_allocations(threshold_bytes: int = 4096) -> bool:
    """Make glibc's ``malloc`` map every block of ``threshold_bytes`` or more on its own and unmap it when freed
    (a fixed ``M_MMAP_THRESHOLD``: by default glibc raises it to the largest block freed, and keeps later blocks
    of that size in its heap, where a buffer reuses pages already resident and no high-water mark sees it).
    Afterwards resident memory follows the live buffers; call it before the buffers are first allocated.
    The default, one page, leaves only blocks under a page to the heap: the high-water mark then misses tens of
    KB at most (at 64 KiB, a tiny model's logits were missed: its b = 1 and b = 4 read alike).
    Slower to allocate: time with :data:`GLIBC_MMAP_THRESHOLD_MAX` instead. False where there is no glibc."""
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, threshold_bytes))
    except (OSError, AttributeError):
        return False


def reset_high_water_mark() -> bool:
    """Set ``VmHWM`` to the current ``VmRSS`` (write ``5`` to ``/proc/self/clear_refs``); False where refused."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        return False
    return True


@functools.cache
def high_water_mark_resets() -> bool:
    """Whether this kernel resets ``VmHWM`` (tried once): 64 MiB touched and freed raise it, and a reset must
    bring it back near ``VmRSS`` (other threads may touch or free a few pages meanwhile)."""
    block = np.ones(64 * MiB // 8)
    del block
    release_free_memory()
    if not reset_high_water_mark():
        return False
    hwm, rss = status_bytes("VmHWM"), status_bytes("VmRSS")
    return hwm is not None and rss is not None and hwm < rss + 16 * MiB


def rss_above(run: Callable[[], Any], ready: Callable[[], Any] = lambda: None) -> tuple[int | None, Any]:
    """``(bytes, result)``: how far ``run()`` raised this process's resident high-water mark above its resident
    memory at the start (free memory released first, then ``ready()`` called: a run's ranks meet there); ``None``
    bytes where the mark cannot be reset."""
    if not high_water_mark_resets():
        return None, run()
    release_free_memory()
    ready()
    reset_high_water_mark()
    start = status_bytes("VmRSS")
    result = run()
    return max(0, status_bytes("VmHWM") - start), result


def step_rss_above(run: Callable[[], Any], ready: Callable[[], Any] = lambda: None) -> tuple[int | None, Any]:
    """:func:`rss_above` with every block of a page or more mapped on its own while ``run()`` runs
    (:func:`map_large_allocations`), so a buffer that reuses pages the heap kept from an earlier step is seen;
    afterwards blocks below :data:`GLIBC_MMAP_THRESHOLD_MAX` come from the heap again, as in a warm process."""
    map_large_allocations()
    try:
        return rss_above(run, ready)
    finally:
        map_large_allocations(GLIBC_MMAP_THRESHOLD_MAX)


#: Longest wait, in seconds, for the other profiling processes to be ready to measure.
PEER_WAIT_S = 120.0


def wait_for_peers(peer_dir: str | None, index: int, peers: int, phase: str = "ready", *,
                   timeout_s: float = PEER_WAIT_S) -> None:
    """Mark this process at ``phase`` (``<peer_dir>/<phase>-<index>``) and wait until all ``peers`` are, so that
    their measurements overlap as a run's ranks do: each phase starts together (a process measuring its trainer's
    step while its peer was still a phase behind read 1.4-1.6x the times of one where both were at it together).
    Nothing to wait for where ``peers`` is 1.

    Raises:
        TimeoutError: naming the peers not ready after ``timeout_s`` seconds.
    """
    if peers <= 1:
        return
    folder = os.fspath(peer_dir)
    write_atomic(os.path.join(folder, f"{phase}-{index}"), phase)
    deadline = time.monotonic() + timeout_s
    while True:
        missing = [i for i in range(peers) if not os.path.exists(os.path.join(folder, f"{phase}-{i}"))]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"profiling process {index}: peers {missing} of {peers} not at {phase!r} after "
                               f"{timeout_s:g} s (in {folder})")
        time.sleep(0.01)


def busy_until_peers_done(peer_dir: str | None, index: int, peers: int, timeout_s: float = PEER_WAIT_S) -> None:
    """Mark this process done measuring (``<peer_dir>/done-<index>``) and keep one core busy (a 256 x 256 float32
    matrix product on this process's BLAS threads, again and again) until all ``peers`` are, or ``timeout_s``
    passes: a peer measuring last still shares the cores with the others, as the ranks of a run do."""
    if peers <= 1:
        return
    folder = os.fspath(peer_dir)
    write_atomic(os.path.join(folder, f"done-{index}"), "done")
    a = np.ones((256, 256), np.float32)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not all(
            os.path.exists(os.path.join(folder, f"done-{i}")) for i in range(peers)):
        a = (a @ a) * (1.0 / 256)


def write_result(path: str, result: dict) -> None:
    write_atomic(path, json.dumps(result, indent=1))


def median(values: list[float]) -> float:
    return float(np.median(values))


def timed(run: Callable[[], Any], repeats: int) -> list[float]:
    """Seconds of ``repeats`` calls of ``run`` (each waits for its result), one by one."""
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - t0)
    return seconds


def thread_count() -> int | None:
    """The threads this process was given (``OMP_NUM_THREADS``, as :func:`workbench.launch.plan.thread_env` sets
    it for every rank), or None."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() else None


def profile_main(argv: list[str] | None, framework: str, measure: Callable[..., dict]) -> int:
    """The profile programs' command line: read the spec, measure it with ``measure(spec, sizes, repeats)``,
    write the result atomically; the process ends with its parent. ``measure`` calls its ``ready`` argument
    once its model is built, before it measures (:func:`wait_for_peers`)."""
    args = parse_profile_args(argv, f"Profile a {framework} model on one process (workbench issue 26).")
    exit_with_parent()
    ready = functools.partial(wait_for_peers, args.peer_dir, args.peer_index, args.peers)
    write_result(args.out, measure(load_spec(args.spec), args.sizes, args.repeats, ready=ready))
    busy_until_peers_done(args.peer_dir, args.peer_index, args.peers)
    return 0


"""One compile of a step for all the JAX ranks on one machine: rank 0 compiles, the others load its executable.

Every rank of a JAX run lowers the same SPMD program and, left alone, compiles it: N ranks on one machine
compile N times at once, on the same cores. On CPU JAX cannot share that work itself: its compile cache keys a
program by the compiling process's own topology, so a rank other than 0 never reads rank 0's entry, and JAX's
``jax_share_binary_between_hosts`` waits for a key that no other rank writes (tried with jax 0.10.2: it timed
out). So, for the ranks of a run on this machine (the driver hands them a private folder; ranks on other
hosts get none and compile their own, since XLA compiles for the CPU it runs on):

* rank 0 writes the digest of its lowered program (with its devices, ``$XLA_FLAGS`` and JAX's version),
  compiles it, and writes the executable (:func:`jax.experimental.serialize_executable.serialize`) beside it.
  Where it read the program back from a compile cache instead (such an executable does not run in another
  process), or cannot serialize or write it (a host callback such as ``jax.debug.print`` does not pickle), it
  says so and shares nothing: each rank reads or compiles its own, as without this module;
* every other rank waits for the digest: where it is its own program's, it loads rank 0's executable
  (``deserialize_and_load``) instead of compiling; where it differs, or rank 0 could not serialize, it
  compiles its own. A failed compile on rank 0 is written there too, so the others fail at once, naming it;
* the step cache: every executable a rank compiled afresh and serialized is also kept in a folder of the
  compile cache (:func:`step_cache_file`, keyed by the program's digest and this machine's CPU; 512 MiB). In a
  later run, where rank 0 read its step back from JAX's cache and so shares nothing, the other ranks load the
  step from there instead of compiling it: 2-9 CPU-seconds a rank for the validation LM's steps, paid again by
  every repeated run of a sweep, a rebuilt notebook or another test (rank 0's own read-back takes 0.3-0.5 s).

A loaded executable is the one rank 0 runs: same program, same options, the same device assignment (the
tests compare such runs with runs whose ranks each compiled). Loading runs machine code rank 0 wrote, so the
folder is the driver's own (``mkdtemp``: readable by this user only, checked before loading) and never comes
from a file a user edits. If the driver is killed, its engines go with it (:mod:`workbench.launch.reaper`) but
its folder stays in the system's temporary folder. The step cache is read only from a folder this user alone can
write, under ``$WORKBENCH_JAX_CACHE`` (off with it), never from a file a user edits.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from workbench.adapters.jax.compile_cache import cache_hits, compile_cache_dir, count_cache_events
from workbench.core.units import MiB
from workbench.runs.atomic import write_atomic

#: Longest wait for rank 0's digest and executable, both together; the driver's startup watchdog (180 s unless
#: the caller sets another) ends a stuck run sooner.
PEER_WAIT_S = 900.0
#: How the step's executable came to this rank (the run summary's ``step_program``).
COMPILED, LOADED, STEP_CACHED = "compiled here", "loaded from rank 0", "loaded from the step cache"
#: The step cache's folder inside the compile cache, and the bytes of executables it keeps (least recently used out;
#: the validation LM's steps are 0.8-4.4 MB each).
STEP_CACHE, STEP_CACHE_BYTES = "steps", 512 * MiB
_DIGEST, _EXECUTABLE, _FAILED, _UNSHARED = "step.digest", "step.executable", "step.failed", "step.unshared"


@contextlib.contextmanager
def compile_folder(framework: str, num_ranks: int, local: bool) -> Iterator[str | None]:
    """The folder one attempt's ranks share their step's compile through (this user's only, removed after): for
    a JAX run of several ranks all on this machine (``local``); None for any other run."""
    if framework != "jax" or num_ranks < 2 or not local:
        yield None
        return
    folder = tempfile.mkdtemp(prefix="workbench-compile-")
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def program_digest(program_text: str, device_ids: Sequence[int] = ()) -> str:
    """The sha256 of a lowered program's text, the ids of its devices in mesh order, ``$XLA_FLAGS``, JAX's
    version and every JAX option (``jax.config.values``: the compile options JAX derives from them, such as
    ``jax_optimization_level``, included): ranks share an executable only for the same program, compiled alike."""
    from importlib import metadata

    import jax

    versions = [metadata.version(name) for name in ("jax", "jaxlib")]
    options = sorted(jax.config.values.items())
    key = repr((program_text, list(device_ids), os.environ.get("XLA_FLAGS", ""), versions, options))
    return hashlib.sha256(key.encode()).hexdigest()


def compile_step(lowered: Any, program_text: str, rank: int, folder: str | Path | None, devices: Any = None,
                 wait_s: float = PEER_WAIT_S) -> tuple[Any, str]:
    """``(compiled, how)``: ``lowered`` compiled here (``how`` is :data:`COMPILED`), or, on a rank other than 0
    given ``folder``, rank 0's executable of the same program loaded (:data:`LOADED`) onto ``devices`` (the
    program's, in its mesh's order; needed with a ``folder``). ``program_text`` is ``lowered.as_text()`` (the
    caller has it already).

    Raises:
        RuntimeError: rank 0 failed to compile the program (its error is in the message).
        TimeoutError: rank 0 wrote neither its executable nor why not within ``wait_s`` seconds.
        ValueError: ``folder`` without ``devices``.
        PermissionError: the folder is not this user's alone (others could have written the executable).
    """
    if folder is None:
        return lowered.compile(), COMPILED
    if devices is None:
        raise ValueError("compile_step: a rank sharing a folder must name the program's devices (its mesh's)")
    devices = list(devices)
    folder, digest = Path(folder), program_digest(program_text, [d.id for d in devices])
    if rank == 0:
        return _compile_and_share(lowered, folder, digest), COMPILED
    deadline = time.monotonic() + wait_s  # one bound for both waits
    if _wait_for(folder / _DIGEST, folder, deadline, wait_s).read_text() != digest:
        return lowered.compile(), COMPILED  # another program than rank 0's: never someone else's executable
    shared = _wait_for(folder / _EXECUTABLE, folder, deadline, wait_s, also=folder / _UNSHARED)
    if shared.name == _EXECUTABLE:
        _check_private(folder)
        return _load(shared.read_bytes(), lowered, devices), LOADED
    cached = step_cache_file(digest)
    blob = _read_kept(cached)
    if blob is not None:
        try:
            compiled = _load(blob, lowered, devices)
        except Exception:  # from another jaxlib build, say: dropped, and compiled here
            with contextlib.suppress(OSError):
                cached.unlink()
        else:
            with contextlib.suppress(OSError):  # recently used: the last out (another process may have evicted it)
                os.utime(cached)
            return compiled, STEP_CACHED
    compiled = lowered.compile()
    _keep(compiled, cached)
    return compiled, COMPILED


def _read_kept(path: Path | None) -> bytes | None:
    """The executable kept at ``path``, its sha256 (the file's first 32 bytes) checked: None where there is none,
    or it cannot be read, or it does not match (a damaged file is removed)."""
    try:
        data = path.read_bytes() if path is not None else b""
    except OSError:
        return None
    if len(data) <= 32:
        return None
    if hashlib.sha256(data[32:]).digest() != data[:32]:
        with contextlib.suppress(OSError):
            path.unlink()
        return None
    return data[32:]


def _load(blob: bytes, lowered: Any, devices: list) -> Any:
    import jax
    from jax.experimental.serialize_executable import deserialize_and_load

    in_tree = jax.tree_util.tree_flatten(lowered.args_info)[1]
    return deserialize_and_load(blob, in_tree, lowered.out_tree, execution_devices=devices)


#: The fields of ``/proc/cpuinfo`` that tell one CPU from another as XLA compiles for it: x86's model and flags,
#: ARM's implementer, part, revision and features.
CPU_FIELDS = ("model name", "flags", "Features", "CPU implementer", "CPU architecture", "CPU variant", "CPU part",
              "CPU revision")


@functools.cache
def _machine() -> str | None:
    """This machine's CPU as XLA compiles for it (its architecture and :data:`CPU_FIELDS`); None where Linux's
    ``/proc/cpuinfo`` does not say (macOS, say): there no executable is kept or loaded, as another CPU sharing the
    home folder could not be told apart."""
    try:
        lines = Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
    except OSError:
        return None
    fields = sorted({x for x in lines if x.split(":")[0].strip() in CPU_FIELDS})
    return repr((platform.machine(), fields)) if fields else None


def step_cache_file(digest: str) -> Path | None:
    """Where the step cache keeps the executable of the program of ``digest`` (:func:`program_digest`) compiled on
    this machine's CPU: a folder of the compile cache made this user's alone; None where the cache is off or
    the folder is not this user's alone (then nothing is read or kept there)."""
    root, machine = compile_cache_dir(), _machine()
    if root is None or machine is None:
        return None
    folder = root / STEP_CACHE
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        _check_private(folder)
    except OSError:  # PermissionError included: another user's folder is never read
        return None
    return folder / (hashlib.sha256((digest + machine).encode()).hexdigest() + ".executable")


def _keep(compiled: Any, path: Path | None, blob: bytes | None = None) -> None:
    """Keep a fresh compile in the step cache at ``path`` (serialized unless ``blob`` is), the least recently used
    out beyond :data:`STEP_CACHE_BYTES`; where it cannot be serialized or written, nothing is kept."""
    if path is None:
        return
    try:
        if blob is None:
            from jax.experimental.serialize_executable import serialize

            blob = serialize(compiled)[0]
        write_atomic(path, hashlib.sha256(blob).digest() + blob)
    except Exception:  # a host callback does not pickle; a full disk: the run goes on, compiling next time
        return
    kept = []
    for other in path.parent.glob("[!.]*.executable"):  # not another process's file being written (a dot file)
        with contextlib.suppress(OSError):  # evicted by another process meanwhile
            info = other.stat()
            kept.append((info.st_mtime, info.st_size, other))
    total = 0
    for _, size, other in sorted(kept, reverse=True):  # the newest first: those past the bound go
        total += size
        if total > STEP_CACHE_BYTES and other != path:
            with contextlib.suppress(OSError):
                other.unlink()


def _check_private(folder: Path) -> None:
    """Loading an executable runs its code: the folder must be this user's alone (as ``mkdtemp`` makes it)."""
    info = folder.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(f"{folder}: a compiled step is loaded only from a folder this user alone can write "
                              f"(owner uid {info.st_uid}, mode {info.st_mode & 0o777:o})")


def _compile_and_share(lowered: Any, folder: Path, digest: str) -> Any:
    write_atomic(folder / _DIGEST, digest)
    count_cache_events()  # whoever turned a compile cache on: the workbench, or JAX_COMPILATION_CACHE_DIR
    hits = cache_hits()
    try:
        compiled = lowered.compile()
    except Exception as err:
        write_atomic(folder / _FAILED, f"{type(err).__name__}: {err}")
        raise
    if cache_hits() > hits:
        # Read back from a compile cache (the workbench's, or one JAX was given otherwise): serialized again, such
        # an executable lacks its functions where another process runs it ("Function ... not found", jax 0.10.2),
        # so each rank reads or compiles its own.
        write_atomic(folder / _UNSHARED, "rank 0 read its step from the compile cache")
        return compiled
    from jax.experimental.serialize_executable import serialize

    try:
        blob = serialize(compiled)[0]
        write_atomic(folder / _EXECUTABLE, blob)
    except Exception as err:  # not serializable (a host callback, say), or not written: each rank compiles its own
        write_atomic(folder / _UNSHARED, f"{type(err).__name__}: {err}")
    else:
        _keep(compiled, step_cache_file(digest), blob)
    return compiled


def _wait_for(path: Path, folder: Path, deadline: float, wait_s: float, also: Path | None = None) -> Path:
    """``path`` (or ``also``) once it exists, before ``deadline`` (``time.monotonic``); raises at once where rank 0
    wrote its failure."""
    while True:
        for found in (path, also):
            if found is not None and found.exists():
                return found
        if (folder / _FAILED).exists():
            raise RuntimeError(f"rank 0 could not compile the step: {(folder / _FAILED).read_text()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 wrote neither its compiled step nor why not within {wait_s:g} s "
                               f"(waited for {path})")
        time.sleep(0.02)

"""OpenBLAS under MLX's CPU ranks on Linux, where MLX's own wheel brings the reference BLAS.

MLX's Linux CPU wheel (``mlx-cpu``) links netlib's reference BLAS for its float matrix products
(``cblas_sgemm``). On a 2-core x86 machine a 128 x 256 x 1024 fp32 product took 11 ms there against 0.5 ms
in OpenBLAS, and the validation LM's forward and backward 0.52 s against 0.06 s: a rank's step was the BLAS.
The ``scipy-openblas32`` wheel (a dependency of the ``mlx`` extra on Linux) carries OpenBLAS, with its
symbols prefixed (``scipy_cblas_sgemm``), so MLX cannot find them. A shim of three functions, compiled once
into ``~/.cache/workbench/blas``, forwards MLX's ``cblas_{s,d,c}gemm`` to them, and the launch preloads it
(``LD_PRELOAD``) in every MLX rank and profile on this machine. MLX's LAPACK calls (``linalg``) stay as they
were. Each rank records the BLAS it really ran (:func:`blas_in_use`), and a profile is keyed by it.

``$WORKBENCH_MLX_BLAS``: ``openblas`` (the default) uses the shim where it can be had (Linux, the reference
BLAS under MLX, ``scipy-openblas32`` and a C compiler); ``reference`` keeps MLX's own. Where the shim
cannot be had, ranks run on the reference BLAS and say so.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import util
from pathlib import Path

#: The variable choosing the BLAS of MLX's CPU ranks, and its values.
BLAS_ENV = "WORKBENCH_MLX_BLAS"
CHOICES = ("openblas", "reference")
#: The shim's file name: how :func:`blas_in_use` finds it among a process's mapped libraries.
SHIM_NAME = "libworkbench_cblas.so"

_SHIM_SOURCE = """typedef int I;
#define FWD(T, S, N) \\
  extern void scipy_cblas_##N(I, I, I, I, I, I, S, const T*, I, const T*, I, S, T*, I); \\
  void cblas_##N(I o, I ta, I tb, I m, I n, I k, S al, const T* a, I lda, const T* b, I ldb, S be, T* c, I ldc) \\
  { scipy_cblas_##N(o, ta, tb, m, n, k, al, a, lda, b, ldb, be, c, ldc); }
FWD(float, float, sgemm)
FWD(double, double, dgemm)
FWD(void, const void*, cgemm)
"""


def blas_choice(environ: dict | None = None) -> str:
    """``$WORKBENCH_MLX_BLAS`` checked: one of :data:`CHOICES` (unset or empty: ``openblas``)."""
    value = (os.environ if environ is None else environ).get(BLAS_ENV, "").strip() or "openblas"
    if value not in CHOICES:
        raise ValueError(f"${BLAS_ENV}={value!r}: choose one of {', '.join(CHOICES)}.")
    return value


def _reference_blas_under_mlx() -> bool:
    """Whether the installed MLX carries netlib's ``libblas`` (a ``mlx_*.libs`` folder beside ``mlx``)."""
    spec = util.find_spec("mlx")
    if spec is None or not spec.submodule_search_locations:
        return False
    site = Path(next(iter(spec.submodule_search_locations))).parent
    return any(site.glob("mlx_*.libs/libblas*.so*"))


def _openblas() -> tuple[Path, str] | None:
    """The folder of ``scipy-openblas32``'s library and its version; None where it is not installed."""
    try:
        import scipy_openblas32
    except ImportError:
        return None
    return Path(scipy_openblas32.get_lib_dir()), scipy_openblas32.__version__


@functools.lru_cache(maxsize=None)
def _build_shim(lib_dir: Path, version: str) -> Path | None:
    """The shim, compiled into the cache once per OpenBLAS and shim source; None without a C compiler."""
    key = hashlib.sha256(f"{_SHIM_SOURCE}\0{lib_dir}\0{version}".encode()).hexdigest()[:16]
    out = Path.home() / ".cache" / "workbench" / "blas" / key / SHIM_NAME
    if out.is_file():
        return out
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        src, built = Path(tmp) / "shim.c", Path(tmp) / SHIM_NAME
        src.write_text(_SHIM_SOURCE)
        argv = [compiler, "-O2", "-shared", "-fPIC", str(src), "-o", str(built), f"-L{lib_dir}", "-lscipy_openblas",
                f"-Wl,-rpath,{lib_dir}"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if done.returncode != 0 or not built.is_file():
            return None
        os.replace(built, out)  # atomic: a concurrent build leaves one whole file
    return out


def mlx_rank_env(environ: dict | None = None) -> dict[str, str]:
    """The variables an MLX rank on this machine needs for OpenBLAS: ``{"LD_PRELOAD": shim}`` (before any
    preload already set), or ``{}`` where :func:`blas_choice` says ``reference`` or the shim cannot be had."""
    environ = os.environ if environ is None else environ
    if blas_choice(environ) != "openblas" or not sys.platform.startswith("linux") or not _reference_blas_under_mlx():
        return {}
    found = _openblas()
    shim = _build_shim(*found) if found else None
    if shim is None:
        return {}
    preloads = [p for p in environ.get("LD_PRELOAD", "").split(":") if p and p != str(shim)]
    return {"LD_PRELOAD": ":".join([str(shim), *preloads])}


def expected_blas(environ: dict | None = None) -> str:
    """The BLAS an MLX rank launched from this process gets (what :func:`blas_in_use` will say there)."""
    if sys.platform == "darwin":
        return "accelerate"
    found = _openblas()
    return f"openblas {found[1]}" if found and mlx_rank_env(environ) else "reference"


def blas_in_use() -> str:
    """The BLAS under MLX in this process: ``openblas <version>`` (the shim is mapped), ``accelerate`` (macOS),
    else ``reference``."""
    if sys.platform == "darwin":
        return "accelerate"
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "reference"
    found = _openblas()
    return f"openblas {found[1] if found else '?'}" if SHIM_NAME in maps else "reference"

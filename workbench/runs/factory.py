"""A user's model and data in a run: the ``"package.module:function"`` factory and the token file.

Pure (standard library, and :mod:`workbench.models.tokens` for the file's header): what can be checked
without building the model. :class:`~workbench.runs.spec.RunSpec` calls these at validation, so a
factory that does not import, or a token file that is missing or shorter than one window, is refused
before any engine starts, naming the field. Calling the factory (which builds an MLX or JAX model) is
the ranks' business: :mod:`workbench.ranks.user_model`.

Where a factory's module is looked for: ``sys.path`` as it is, plus the working directory and the
repository root (:func:`import_paths`), the same folders the driver puts on every engine's path.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from pathlib import Path
from typing import Callable

from workbench.core.fingerprint import file_sha256
from workbench.core.paths import REPO_ROOT

#: ``package.module:function``: dotted identifiers, one colon.
FACTORY_PATTERN = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
#: Token dtypes a headerless ``.bin`` may hold (:func:`workbench.models.tokens.load_token_file`).
DATA_DTYPES = ("uint16", "uint32")


def import_paths(cwd: str | None = None) -> list[str]:
    """The folders a factory's module is imported from besides ``sys.path``: the working directory
    (a notebook's folder: its own modules) and the repository root (``examples``)."""
    return [str(Path(cwd or os.getcwd()).resolve()), str(REPO_ROOT)]


def add_import_paths(paths: list[str]) -> None:
    """Append each existing folder of ``paths`` to ``sys.path`` once (after what is there: an installed
    package of the same name wins, as it would in the notebook)."""
    for path in paths:
        if path not in sys.path and Path(path).is_dir():
            sys.path.append(path)


def resolve_factory(field: str, name: str) -> tuple[Callable, Path]:
    """The function ``name`` (``"package.module:function"``) names, and its module's source file.

    Raises:
        ValueError: naming ``RunSpec.<field>``: not that form, the module does not import (its error
            and the folders searched), the function is missing or not callable, or it has no source file.
    """
    def bad(why: str) -> ValueError:
        return ValueError(f"RunSpec.{field}={name!r}: {why}")

    if not isinstance(name, str) or not FACTORY_PATTERN.match(name):
        raise bad("must be 'package.module:function' (e.g. 'examples.tiny_mlp_lm:mlx_factory')")
    module_name, function = name.split(":")
    add_import_paths(import_paths())
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # the user's module may raise anything at import
        raise bad(f"cannot import {module_name!r} ({type(err).__name__}: {err}); searched sys.path, the working "
                  f"directory and {REPO_ROOT} (make it a package there, or pip install -e it)") from None
    fn = getattr(module, function, None)
    if not callable(fn):
        raise bad(f"module {module_name!r} ({getattr(module, '__file__', '?')}) has no function {function!r}")
    source = getattr(module, "__file__", None)
    if not source or not Path(source).is_file():
        raise bad(f"module {module_name!r} has no source file to hash (a built-in or namespace module)")
    return fn, Path(source)


def source_sha256(path: Path) -> str:
    """sha256 hex digest of a source file's bytes (:func:`workbench.core.fingerprint.file_sha256`)."""
    return file_sha256(path)


#: Digests already taken in this process, by the file's identity and state (see :func:`data_sha256`).
_DATA_DIGESTS: dict[tuple, str] = {}


def data_sha256(path: str | os.PathLike) -> str:
    """sha256 hex digest of a token file's bytes (``RunSpec.data_sha256``), read once per file state.

    Hashing a large file costs about a second per GB, so the digest is remembered in this process by the
    file's device, inode, size, modification and change times (ns): any write to the file, or a new file
    at the path, changes one of them and the file is read again. Each engine hashes it once, at start.
    """
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _DATA_DIGESTS:
        if len(_DATA_DIGESTS) >= 256:  # files of a long session: forget the old ones
            _DATA_DIGESTS.clear()
        _DATA_DIGESTS[key] = file_sha256(path)
    return _DATA_DIGESTS[key]


def check_data_file(field: str, path: str, dtype: str | None, seq_len: int) -> int:
    """Open the token file ``path`` (header and size only: no scan) and return its number of tokens.

    Raises:
        ValueError: naming ``RunSpec.<field>`` and the file: missing, empty, not whole tokens of
            ``dtype``, or fewer tokens than one window of ``seq_len + 1``.
    """
    from workbench.models.tokens import load_token_file

    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path).strip():
        raise ValueError(f"RunSpec.{field}={path!r}: must be the path of a token file (.bin or .npy)")
    if dtype is not None and dtype not in DATA_DTYPES:
        raise ValueError(f"RunSpec.data_dtype={dtype!r}: choose one of {', '.join(DATA_DTYPES)}, or None")
    try:
        tokens = load_token_file(path, dtype=dtype)
    except ValueError as err:
        raise ValueError(f"RunSpec.{field}={path!r}: {err}") from None
    if len(tokens) < seq_len + 1:
        raise ValueError(f"RunSpec.{field}={path!r}: holds {len(tokens)} tokens, fewer than one window of "
                         f"model['seq_len'] + 1 = {seq_len + 1}")
    return len(tokens)

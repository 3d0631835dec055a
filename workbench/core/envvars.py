"""Environment variables set for the length of a with block (a kernel's settings, kaleido's browser), and the
launch's variable for MLX's ring ranks on a host with too few cores (:data:`RING_PIECE_ENV`).

In the lowest layer: :mod:`workbench.core.chromium` hands kaleido its browser through it, and
:mod:`workbench.publish.execute` a kernel its settings.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Mapping

#: Set by the launch for MLX's ring ranks (:func:`workbench.launch.plan.thread_env`: 256 KiB where a host's ranks
#: outnumber half its cores, else 0), read by :func:`workbench.adapters.mlx.transport.gather_bucket` and
#: ``reduce_scatter_bucket``: the bytes of the pieces they gather in (0 or unset: one call).
RING_PIECE_ENV = "WORKBENCH_MLX_RING_PIECE"
#: The pieces' bytes where set: MLX's ring splits an all_gather of 512 KiB or more over two polling socket threads.
RING_PIECE_BYTES = 256 * 1024


def ring_piece_bytes(environ: Mapping[str, str] | None = None) -> int:
    """The bytes of an MLX ring rank's gather pieces (``$WORKBENCH_MLX_RING_PIECE`` in ``environ``, default this
    process's), 0 for one call.

    Raises:
        ValueError: naming the variable, where it is not 0 or a whole number of bytes from 1 KiB up to
            :data:`RING_PIECE_BYTES` (a piece MLX's ring would not split again).
    """
    raw = (os.environ if environ is None else environ).get(RING_PIECE_ENV, "0").strip() or "0"
    if not (raw.isascii() and raw.isdigit()) or (int(raw) and not 1024 <= int(raw) <= RING_PIECE_BYTES):
        raise ValueError(f"${RING_PIECE_ENV}={raw!r}: 0 (one call), or the bytes of each gather piece, from 1024 "
                         f"to {RING_PIECE_BYTES} (MLX's ring splits a gather of twice that over two sockets)")
    return int(raw)


@contextmanager
def scoped_env(**values: str):
    """Set environment variables for the duration of a with block, then restore them (unset if they were)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

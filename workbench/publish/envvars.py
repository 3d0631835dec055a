"""Environment variables set for the length of a with block (a kernel's settings, kaleido's browser).

Below :mod:`~workbench.publish.execute` and :mod:`~workbench.publish.labsave`, which set variables for a child
process and restore them (:mod:`~workbench.publish.static` hands kaleido its browser through
:func:`workbench.core.chromium.chromium_for_kaleido`).
"""

from __future__ import annotations

import os
from contextlib import contextmanager


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

"""Environment variables set for the length of a with block (a kernel's settings, kaleido's browser).

In the lowest layer: :mod:`workbench.core.chromium` hands kaleido its browser through it, and
:mod:`workbench.publish.execute` a kernel its settings.
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

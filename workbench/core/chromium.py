"""The one Chromium finder: every browser the workbench drives (kaleido's images from the explorers and the
static exports, playwright's PDF, Lab-style snapshots) is the one :func:`find_chromium` names.

In the lowest layer so that views (:mod:`workbench.views.explorer_tools`) and publish
(:mod:`workbench.publish.static`, which keeps the name) both import it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Iterator

from workbench.core.envvars import scoped_env

#: Chromium executables tried in order on PATH (``WORKBENCH_CHROMIUM`` first); Debian's is ``chromium``.
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str:
    """The Chromium to drive: ``$WORKBENCH_CHROMIUM``, else the first of :data:`CHROMIUM_NAMES` on PATH.

    Raises:
        FileNotFoundError: naming what was tried and how to install Debian's ``chromium``.
    """
    given = os.environ.get("WORKBENCH_CHROMIUM")
    if given:
        if not (Path(given).is_file() and os.access(given, os.X_OK)):
            raise FileNotFoundError(f"WORKBENCH_CHROMIUM={given!r} is not an executable file.")
        return given
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    raise FileNotFoundError(f"No Chromium found (tried {', '.join(CHROMIUM_NAMES)} on PATH): install Debian's "
                            "`apt-get install chromium`, or set WORKBENCH_CHROMIUM to a Chrome/Chromium executable.")


@contextlib.contextmanager
def chromium_for_kaleido() -> Iterator[str]:
    """:func:`find_chromium`'s browser as kaleido's ``BROWSER_PATH`` (its browser finder, choreographer, reads
    it) for the block, then ``BROWSER_PATH`` as it was; yields the browser. Raises as :func:`find_chromium`,
    before the block runs."""
    chromium = find_chromium()
    with scoped_env(BROWSER_PATH=chromium):
        yield chromium

"""``python scripts/hosts_rig ...`` or, with ``scripts/`` on the path, ``python -m hosts_rig ...``."""

import sys
from pathlib import Path

if not __package__:  # run as a folder: Python put the folder itself on sys.path, where its modules would shadow others
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from hosts_rig.cli import main  # noqa: E402 - after the path is right

sys.exit(main())

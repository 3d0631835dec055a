"""Test-wide settings: notebooks run in their small (CI) configuration under pytest.

Set here, at import time, so the kernels nbval starts inherit it.
"""

import os

os.environ.setdefault("WORKBENCH_SMALL", "1")

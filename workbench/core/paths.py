"""The repository's folders, computed once (with an editable install, the checkout itself)."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = REPO_ROOT / "notebooks"
#: Where notebooks store their runs unless ``$WORKBENCH_RUNS`` says otherwise (git-ignored).
RUNS_DIR = REPO_ROOT / "runs"
VENDOR_DIR = REPO_ROOT / "vendor"

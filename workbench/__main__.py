"""Command line: ``python -m workbench build`` (the main job) and notebook upkeep.

    python -m workbench build [--out build] [--small] [NOTEBOOK ...]
    python -m workbench refresh [NOTEBOOK ...]   # re-execute in place for nbval
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="workbench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="execute the notebooks headless and write their HTML")
    build.add_argument("--out", type=Path, default=Path("build"), help="output folder (default: build)")
    build.add_argument("--small", action="store_true", help="small configuration (as in CI)")
    build.add_argument("notebooks", nargs="*", type=Path)
    refresh = sub.add_parser("refresh", help="re-execute notebooks in place, in the form nbval checks")
    refresh.add_argument("notebooks", nargs="*", type=Path)
    args = parser.parse_args(argv)

    from . import nbtools

    if args.command == "build":
        for r in nbtools.build_notebooks(args.out / "html", args.notebooks or None, small=args.small):
            print(f"{r.notebook.name}: {r.seconds:.1f} s -> {r.html} ({r.html_bytes / 2**20:.1f} MiB)")
        return 0
    for path in args.notebooks or sorted(nbtools.NOTEBOOK_DIR.glob("[0-9]*.ipynb")):
        nbtools.refresh_notebook(path)
        print(f"refreshed {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

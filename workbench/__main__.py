"""Command line: ``python -m workbench build`` (the main job), slide decks, and notebook upkeep.

    python -m workbench build [--out build] [--small | --full] [--static] [--debug] [NOTEBOOK ...]
    python -m workbench slides [NOTEBOOK ...] [--out build/slides] [--static] [--no-execute] [--small]
    python -m workbench refresh [NOTEBOOK ...]   # re-execute in place for nbval
    python -m workbench plan MODEL --ranks N --memory 24GiB [--validate] [--json]   # the plan advisor
    python -m workbench review MODEL --ranks N [--memory 24GiB] [--out build/review]  # its deck (notebook 08)

``build`` writes every notebook's HTML to ``<out>/html`` and the design-review deck to
``<out>/slides``, showing which notebook, cell and run it is on (a status line on a terminal, plain
lines in a log). Runs are stored as they finish: an interrupted build, started again, skips them.
A failure is one line (notebook, cell, run, error; the traceback goes to ``<out>/logs``), exit 1.
Every output is written atomically: on a full disk the error names the file, and an earlier one stays.
A mistake in the command (a missing or unreadable notebook, two notebooks of the same name, an
``--out`` that cannot be written or that another build is using, an unknown ``--theme``) is one line
saying what to do, exit 2; ``--debug`` shows any traceback. One build at a time holds an ``--out``
(``<out>/.build.lock``; a refusal names the holder's pid, start and command).
``slides`` exports the deck (default) or any notebooks as offline reveal.js decks; ``--static``
adds each figure as PNG and SVG and the deck as PDF (needs Chromium).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from pathlib import Path


def _deck_line(r) -> str:
    return (f"{r.notebook.name}: {r.seconds:.1f} s -> {r.html} ({r.num_figures} figures; deck with assets "
            f"{r.deck_bytes / 2**20:.1f} MiB)" + "".join(f"\n  {p}" for p in r.static))


def _build(args) -> int:
    from workbench.publish.buildlog import OutInUse, lock_out

    try:
        with lock_out(args.out, args.command_line):  # two builds on one --out would share progress.jsonl
            return _build_locked(args)
    except OutInUse as err:
        raise UsageError(str(err)) from None


def _build_locked(args) -> int:
    import time

    from workbench.core.events import format_duration
    from workbench.publish.buildlog import ProgressPrinter
    from workbench.publish.nbtools import BuildError, build_notebooks
    from workbench.publish.slides import DECK_NOTEBOOK, export_slides

    config = "small" if args.small else "full" if args.full else "default"
    t0 = time.monotonic()
    printer = ProgressPrinter(args.out / "logs" / "progress.jsonl").start()
    printer.message(f"workbench build ({config} configuration) -> {args.out}")
    try:
        build_notebooks(args.out / "html", args.notebooks or None, small=args.small, full=args.full, progress=printer)
        if not args.notebooks or DECK_NOTEBOOK.resolve() in {p.resolve() for p in args.notebooks}:
            printer.message(f"deck: exporting {DECK_NOTEBOOK.name} as slides")
            printer.message("deck: " + _deck_line(export_slides(DECK_NOTEBOOK, args.out / "slides", small=args.small,
                                                                static=args.static)))
    except BuildError as err:
        printer.close()
        if args.debug and err.log is not None:
            print(err.log.read_text(), file=sys.stderr)
        if err.interrupted:
            print(f"workbench build: {err}. Stored runs are kept; run the same command to continue.", file=sys.stderr)
            return 130
        log = f" (traceback: {err.log})" if err.log is not None and not args.debug else ""
        print(f"workbench build failed: {err}{log}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        printer.close()
        print("workbench build: interrupted. Stored runs are kept; run the same command to continue.", file=sys.stderr)
        return 130
    except OSError as err:  # the deck could not be written (a full disk): the error names the file
        printer.close()
        if args.debug:
            raise
        print(f"workbench build failed: {err}", file=sys.stderr)
        return 1
    printer.close()
    print(f"workbench build: done in {format_duration(time.monotonic() - t0)} -> {args.out}")
    return 0


class UsageError(Exception):
    """A mistake in the command line: printed as one line, exit 2."""


def check_arguments(args) -> None:
    """Refuse what would fail deep inside with a traceback: every notebook named must be a readable
    ``.ipynb``, ``--out`` a folder that can be written, ``--theme`` a vendored theme.

    Raises:
        UsageError: saying what is wrong and what to do.
    """
    for path in args.notebooks:
        if not path.is_file():
            raise UsageError(f"no such notebook: {path} (give the path of an existing .ipynb)")
    if args.command in ("build", "slides"):  # outputs are named by the notebook's stem
        from workbench.publish.buildlog import refuse_name_clashes

        out = args.out / "html" if args.command == "build" else args.out
        try:
            refuse_name_clashes(args.notebooks, out, ".html" if args.command == "build" else ".slides.html")
        except ValueError as err:
            raise UsageError(str(err)) from None
    out = getattr(args, "out", None)
    if out is not None:
        try:
            out.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=out):
                pass
        except OSError as err:
            raise UsageError(f"cannot write to --out {out} ({err.strerror or err}); choose a folder you can write") \
                from None
    theme = getattr(args, "theme", None)
    if theme is not None:
        from workbench.publish.slides import VENDOR_DIR

        themes = sorted(p.stem for p in (VENDOR_DIR / "reveal.js" / "dist" / "theme").glob("*.css"))
        if theme not in themes:
            raise UsageError(f"unknown --theme {theme!r}; vendored themes: {', '.join(themes)}")
    # Last: importing nbformat costs 2 s (jsonschema's format checks compile a grammar at import), which the
    # checks above, a missing notebook or a wrong theme, need not wait for.
    for path in args.notebooks:
        import nbformat

        try:
            nbformat.read(path, as_version=4)
        except Exception as err:  # NotJSONError, a schema error, an undecodable file...
            reason = str(err).splitlines()[0][:120] if str(err) else type(err).__name__
            raise UsageError(f"{path} is not a readable notebook ({reason}); restore it, e.g. git checkout -- {path}") \
                from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="workbench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="execute the notebooks headless and write their HTML, and the slide deck")
    build.add_argument("--out", type=Path, default=Path("build"), help="output folder (default: build)")
    size = build.add_mutually_exclusive_group()
    size.add_argument("--small", action="store_true", help="small configuration (as in CI)")
    size.add_argument("--full", action="store_true", help="full configuration: bigger models, more sizes and steps")
    build.add_argument("--debug", action="store_true", help="show the full traceback of a failure")
    build.add_argument("--static", action="store_true", help="also the deck's figures as PNG/SVG and the deck as PDF")
    build.add_argument("notebooks", nargs="*", type=Path)
    slides = sub.add_parser("slides", help="export notebooks (default: the design-review deck) as offline reveal.js decks")
    slides.add_argument("notebooks", nargs="*", type=Path)
    slides.add_argument("--out", type=Path, default=Path("build") / "slides", help="output folder (default: build/slides)")
    slides.add_argument("--static", action="store_true", help="also each figure as PNG/SVG and the deck as PDF")
    slides.add_argument("--no-execute", dest="execute", action="store_false", help="use the stored outputs")
    slides.add_argument("--small", action="store_true", help="execute in the small configuration (as in CI)")
    slides.add_argument("--hide-code", action="store_true", help="show outputs only")
    slides.add_argument("--theme", default="workbench", help="a vendored reveal.js theme (default: workbench)")
    refresh = sub.add_parser("refresh", help="re-execute notebooks in place, in the form nbval checks")
    refresh.add_argument("notebooks", nargs="*", type=Path)
    from workbench.studies.planner.cli import add_plan_parser

    add_plan_parser(sub)  # plan and review: the plan advisor (workbench.studies.planner.cli)
    for command in (slides, refresh):
        command.add_argument("--debug", action="store_true", help="show the full traceback of a failure")
    args = parser.parse_args(argv)
    args.command_line = shlex.join(["python", "-m", "workbench", *map(str, sys.argv[1:] if argv is None else argv)])
    try:
        check_arguments(args)
        return _dispatch(args)
    except UsageError as err:
        if args.debug:
            raise
        print(f"workbench {args.command}: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # a bug: one line here, the traceback with --debug
        if args.debug:
            raise
        print(f"workbench {args.command} failed: {type(err).__name__}: {err} (run again with --debug for the "
              f"traceback)", file=sys.stderr)
        return 1


def _review(args) -> int:
    """Notebook 08 with the user's model, ranks and budget in its parameter cell, executed and exported as an
    offline deck under ``--out`` (the workbench's own reference study is not in it)."""
    import nbformat

    from workbench.core.paths import NOTEBOOK_DIR
    from workbench.publish.slides import export_slides
    from workbench.studies.planner.cli import review_parameters

    nb = nbformat.read(NOTEBOOK_DIR / "08_plan_your_run.ipynb", as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code" and c.source.startswith("MODEL = "))
    cell.source = review_parameters(args)
    nb.metadata.setdefault("workbench", {})["hide_code"] = True
    args.out.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, args.out / "plan_review.ipynb")
    print(_deck_line(export_slides(args.out / "plan_review.ipynb", args.out, static=args.static)))
    return 0


def _dispatch(args) -> int:
    from workbench.publish import nbtools

    if args.command == "build":
        return _build(args)
    if args.command in ("plan", "review"):
        from workbench.studies.planner.cli import run_plan

        try:
            return run_plan(args) if args.command == "plan" else _review(args)
        except ValueError as err:  # a bad model, hosts file or knob, named
            raise UsageError(str(err)) from None
    if args.command == "slides":
        from workbench.publish.slides import DECK_NOTEBOOK, export_slides

        for path in args.notebooks or [DECK_NOTEBOOK]:
            try:
                print(_deck_line(export_slides(path, args.out, execute=args.execute, small=args.small, static=args.static,
                                          theme=args.theme, hide_code=True if args.hide_code else None)))
            except nbtools.BuildError as err:
                print(f"workbench slides failed: {err}", file=sys.stderr)
                return 130 if err.interrupted else 1
        return 0
    for path in args.notebooks or sorted(nbtools.NOTEBOOK_DIR.glob("[0-9]*.ipynb")):
        try:
            nbtools.refresh_notebook(path)
        except nbtools.BuildError as err:  # one line, as the build does; the notebook file is left as it was
            print(f"workbench refresh failed: {err}", file=sys.stderr)
            return 130 if err.interrupted else 1
        print(f"refreshed {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The command line's mistakes are one line saying what to do, exit 2; tracebacks only with --debug (issue 14, item 14)."""

import subprocess
import sys

import pytest

from workbench.core.paths import REPO_ROOT

DECK = REPO_ROOT / "notebooks" / "00_design_review.ipynb"


def workbench(*args, cwd):
    done = subprocess.run([sys.executable, "-m", "workbench", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=300)
    return done.returncode, done.stderr


@pytest.mark.parametrize("command", ["slides", "refresh", "build"])
@pytest.mark.parametrize("content,reason", [(None, "no such notebook: nb.ipynb (give the path of an existing .ipynb)"),
                                            ("{", "nb.ipynb is not a readable notebook (Notebook does not appear to "
                                                  "be JSON"),
                                            ("", "nb.ipynb is not a readable notebook")])
def test_a_missing_corrupt_or_empty_notebook_is_one_line(tmp_path, command, content, reason):
    if content is not None:
        (tmp_path / "nb.ipynb").write_text(content)
    extra = ["--no-execute"] if command == "slides" else []
    code, err = workbench(command, "nb.ipynb", *extra, cwd=tmp_path)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"workbench {command}: {reason}") and "Traceback" not in err
    if content is not None:
        assert "restore it, e.g. git checkout -- nb.ipynb" in err


def test_an_out_folder_that_cannot_be_written_is_one_line(tmp_path):
    (tmp_path / "a_file").write_text("x")
    code, err = workbench("slides", DECK, "--no-execute", "--out", "a_file/deck", cwd=tmp_path)
    assert code == 2 and err.strip() == ("workbench slides: cannot write to --out a_file/deck (Not a directory); "
                                         "choose a folder you can write")


@pytest.mark.parametrize("theme", ["nope", "../x"])
def test_an_unknown_theme_lists_the_vendored_themes(tmp_path, theme):
    code, err = workbench("slides", DECK, "--no-execute", "--theme", theme, "--out", tmp_path, cwd=tmp_path)
    assert code == 2 and err.strip() == f"workbench slides: unknown --theme {theme!r}; vendored themes: workbench"


def test_debug_shows_the_traceback(tmp_path):
    code, err = workbench("refresh", "nb.ipynb", "--debug", cwd=tmp_path)
    assert code == 1 and "Traceback" in err and "UsageError: no such notebook" in err

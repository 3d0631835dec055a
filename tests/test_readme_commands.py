"""The README's commands that need a process of their own (issue 29, item 14): the entry points answer
``--help``, the shell scripts parse, and ``scripts/test.sh`` goes on to pytest when apt cannot install, with
the note the README promises. ``tests/test_readme.py`` checks every command's program and flags in one process.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


@pytest.mark.parametrize("argv", [["-m", "workbench", "--help"], ["scripts/hosts_rig", "--help"],
                                  ["scripts/make_token_file.py", "--help"]], ids=["workbench", "hosts_rig", "make_token_file"])
def test_an_entry_point_the_readme_names_answers_help(argv):
    done = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
    if argv[1] == "workbench":  # every subcommand the README runs is one the command line has
        named = set(re.findall(r"python3? -m workbench (\w+)", README))
        assert named and named <= set(re.findall(r"\{([\w,]+)\}", done.stdout)[0].split(",")), named


@pytest.mark.parametrize("script", ["scripts/test.sh", "scripts/fresh_check.sh", "scripts/update_constraints.sh"])
def test_the_shell_scripts_parse(script):
    done = subprocess.run(["bash", "-n", script], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def test_a_failed_apt_is_a_note_and_the_script_goes_on(tmp_path):
    """No mirror reachable: apt-get fails. Under ``set -euo pipefail`` the script must still reach pytest,
    saying which tests will be skipped (the README's promise)."""
    script = (ROOT / "scripts" / "test.sh").read_text()
    need = re.search(r"^need\(\) \{\n.*?^\}\n", script, re.M | re.S).group(0)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "apt-get").write_text("#!/bin/sh\necho 'E: no mirror reachable' >&2\nexit 100\n")
    (fake / "apt-get").chmod(0o755)
    body = f"set -euo pipefail\n{need}need wb-no-such-command 'wb-no-such-package' 'imaginary'\necho reached-pytest\n"
    done = subprocess.run(["bash", "-c", body], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr
    assert "the imaginary tests will be skipped" in done.stdout and done.stdout.rstrip().endswith("reached-pytest")

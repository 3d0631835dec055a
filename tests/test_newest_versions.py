"""The compared notebooks pass under the newest releases pyproject.toml's bounds allow.

That is what someone who installs the package into their own environment gets, and what
constraints.txt pins the day it is regenerated. pip resolves a fresh install without the
constraints (``--dry-run``: nothing is installed):

* if it picks exactly the pinned versions, the environment running this suite holds them (checked
  here), so this suite's nbval pass over ``notebooks/`` is the proof;
* if a newer release has come out, a brand-new virtual environment gets the newest versions and nbval
  runs every notebook there, against the stored outputs.
"""

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent


def pins() -> dict[str, str]:
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    return {canonicalize_name(n): v.strip() for n, v in (x.split("==") for x in lines if x.strip() and not x.startswith("#"))}


def resolve_newest(tmp_path: Path) -> dict[str, str]:
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
         "-e", f"{ROOT}[all,test]"], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        if any(s in proc.stderr for s in ("Could not fetch URL", "NewConnectionError", "Temporary failure in name resolution")):
            pytest.skip(f"not run: the package index cannot be reached here ({proc.stderr.strip().splitlines()[-1]})")
        raise AssertionError(f"pip could not resolve a fresh install:\n{proc.stderr}")
    installs = json.loads(report.read_text())["install"]
    return {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in installs
            if canonicalize_name(i["metadata"]["name"]) != "fsdp-workbench"}


def test_compared_notebooks_pass_under_the_newest_versions_the_bounds_allow(tmp_path):
    newest, pinned = resolve_newest(tmp_path), pins()
    assert set(newest) <= set(pinned) | {"pip", "setuptools", "wheel"}, \
        f"a fresh install gets packages constraints.txt does not pin: {sorted(set(newest) - set(pinned))}"
    newer = {name: (pinned.get(name), version) for name, version in newest.items() if pinned.get(name) != version}
    if not newer:
        # The pins are the newest: this environment must hold them, so this suite's nbval pass is the proof.
        installed = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}
        drift = {n: (v, installed.get(n)) for n, v in pinned.items() if installed.get(n) not in (None, v)}
        assert not drift, f"this environment is not the pinned one (pinned, installed): {drift}"
        return
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", "-e", f"{ROOT}[all,test]"], check=True, timeout=1800)
    env = {**os.environ, "WORKBENCH_SMALL": "1", "WORKBENCH_RUNS": str(tmp_path / "runs")}
    proc = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval", "--nbval-current-env",
                           *sorted(str(p) for p in (ROOT / "notebooks").glob("[0-9]*.ipynb"))],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, (f"under newer releases {newer} the stored outputs no longer hold:\n"
                                  + proc.stdout[-6000:])

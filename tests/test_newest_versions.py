"""The compared notebooks pass under the newest releases pyproject.toml's bounds allow.

That is what someone who installs the package into their own environment gets, and what
constraints.txt pins the day it is regenerated. pip resolves a fresh install without the
constraints (``--dry-run``: nothing is installed):

* if it picks exactly the pinned versions, the environment running this suite holds them (checked
  here), so this suite's nbval pass over ``notebooks/`` is the proof;
* if a newer release of a package that can change a compared output has come out
  (:data:`OUTPUT_PACKAGES`), a brand-new virtual environment gets the newest versions and nbval runs
  every notebook there, against the stored outputs. Newer releases of the others (certifi, PyYAML,
  packaging, hypothesis, JupyterLab's server side, ...) cannot change what nbval compares, so they
  do not cost a second run of every notebook (12 minutes on 2 cores); they are named in the output.
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

#: Packages whose release can change what a compared notebook output holds: the numerics a run
#: computes, the tables and figures it stores, how engines run it, and how nbval executes and compares
#: the notebook. Every other pinned package is tooling (JupyterLab's server, the browser tests, the
#: test runner's plugins, HTTP and certificates) and cannot change a compared output.
OUTPUT_PACKAGES = frozenset(canonicalize_name(n) for n in (
    # numerics of the runs
    "numpy", "scipy", "mlx", "mlx-cpu", "jax", "jaxlib", "flax", "optax", "ml_dtypes", "opt_einsum",
    # tables and figures as stored
    "pandas", "plotly", "narwhals", "ipywidgets", "anywidget",
    # engines, kernels, notebook execution and comparison
    "ipyparallel", "psutil", "pyzmq", "tornado", "ipykernel", "ipython", "jupyter_client", "jupyter_core",
    "traitlets", "comm", "nbclient", "nbformat", "nbval",
))


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
    moved = {name: (pinned.get(name), version) for name, version in newest.items() if pinned.get(name) != version}
    newer = {name: versions for name, versions in moved.items() if name in OUTPUT_PACKAGES}
    if not newer:
        # No package that can change a compared output has moved: this environment must hold their pins,
        # so this suite's nbval pass is the proof.
        installed = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}
        drift = {n: (v, installed.get(n)) for n, v in pinned.items()
                 if n in OUTPUT_PACKAGES and installed.get(n) not in (None, v)}
        assert not drift, f"this environment is not the pinned one (pinned, installed): {drift}"
        if moved:
            print(f"moved past the pins, none able to change a compared output: {sorted(moved)}")
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


def test_every_output_package_is_pinned():
    # A name misspelt here would never count as moved: each must be a package constraints.txt pins.
    assert OUTPUT_PACKAGES <= set(pins()), sorted(OUTPUT_PACKAGES - set(pins()))

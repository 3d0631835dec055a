"""The repository's promises to a newcomer: README commands, CI, conda and pip agree."""

import re
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
CONDA_NAMES = {"pyyaml": "pyyaml"}  # PyPI name -> conda-forge name where they differ


def readme_commands():
    text = (ROOT / "README.md").read_text()
    first_block = re.search(r"```(?:bash|sh)?\n(.*?)```", text, re.S).group(1)
    return [line for line in first_block.splitlines() if line.strip() and not line.startswith("#")]


def test_readme_starts_with_exactly_two_commands_and_ci_runs_the_test_one():
    commands = readme_commands()
    assert len(commands) == 2, commands
    main, test = commands
    assert "workbench build" in main and test == "bash scripts/test.sh"
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert 'pip install -q -e ".[all,test]"' in script and "python3 -m pytest" in script
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test in ci, "the README's test command must appear verbatim in .ci/run"


def conda_requirements():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda, pip = {}, []
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            pip.extend(dep["pip"])
            continue
        m = re.match(r"^([A-Za-z0-9_.\-]+)\s*(.*)$", dep)
        conda[m.group(1).lower()] = m.group(2).strip()
    return env, conda, pip


def test_environment_yml_agrees_with_pyproject():
    env, conda, pip = conda_requirements()
    assert "conda-forge" in env["channels"]
    optional = PYPROJECT["project"]["optional-dependencies"]
    # Every core, notebook and test requirement is a conda package with the same bound.
    for line in PYPROJECT["project"]["dependencies"] + optional["notebook"] + optional["test"]:
        req = Requirement(line)
        name = CONDA_NAMES.get(req.name.lower(), req.name.lower())
        assert name in conda, f"{req.name} is in pyproject.toml but not in environment.yml"
        assert conda[name].replace(" ", "") == str(req.specifier).replace(" ", ""), req.name
    # Nothing in conda's list that pyproject does not ask for (besides python and pip).
    asked = {CONDA_NAMES.get(Requirement(x).name.lower(), Requirement(x).name.lower())
             for x in PYPROJECT["project"]["dependencies"] + optional["notebook"] + optional["test"]}
    assert set(conda) - asked == {"python", "pip"}
    # The pip section installs the package itself with every extra (MLX and JAX come from there).
    (line,) = pip
    extras = set(re.search(r"\[(.*)\]", line).group(1).split(","))
    assert line.startswith("-e ") and extras == {"all", "test"}
    all_extras = set(re.search(r"\[(.*)\]", optional["all"][0]).group(1).split(","))
    assert all_extras | {"all", "test"} == set(optional)
    # The conda Python satisfies requires-python.
    version = conda["python"].lstrip("=")
    assert Requirement(f"python{PYPROJECT['project']['requires-python']}").specifier.contains(version + ".0")


def test_mlx_extra_is_cpu_build_on_linux():
    mlx = [Requirement(x) for x in PYPROJECT["project"]["optional-dependencies"]["mlx"]]
    linux = [r for r in mlx if r.marker.evaluate({"sys_platform": "linux"})]
    assert len(linux) == 1 and linux[0].extras == {"cpu"}

"""The repository's promises to a newcomer: README commands, CI, conda and pip agree."""

import re
import subprocess
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

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
    # Both commands install the versions CI tested.
    assert main.startswith('python3 -m pip install -c constraints.txt -e ".[all]" && ')
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert 'pip install -q -c constraints.txt -e ".[all,test]"' in script and "python3 -m pytest" in script
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test in ci, "the README's test command must appear verbatim in .ci/run"
    # ... inside a virtual environment made for that run, activated before the test command.
    venv = next(i for i, line in enumerate(ci) if line.startswith("python3 -m venv "))
    activate = next(i for i, line in enumerate(ci) if "/bin/activate" in line and not line.startswith("#"))
    assert venv < activate < ci.index(test)


def test_fresh_check_runs_the_readme_commands_verbatim():
    script = (ROOT / "scripts" / "fresh_check.sh").read_text()
    assert "git clone" in script and "python3 -m venv" in script
    # It takes the commands from the README's first block, the same lines readme_commands() reads.
    awk = re.search(r"awk '([^']*)' README.md", script).group(1)
    out = subprocess.run(["awk", awk, str(ROOT / "README.md")], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == readme_commands()


def pinned() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version.strip()
    return pins


def requirements(extra_names=("mlx", "jax", "notebook", "slides", "test")) -> list[Requirement]:
    optional = PYPROJECT["project"]["optional-dependencies"]
    lines = PYPROJECT["project"]["dependencies"] + [x for name in extra_names for x in optional[name]]
    return [Requirement(line) for line in lines]


def test_every_requirement_has_honest_bounds_and_a_pin_inside_them():
    pins = pinned()
    linux = {"sys_platform": "linux", "platform_system": "Linux"}
    for req in requirements():
        ops = {s.operator for s in req.specifier}
        assert ">=" in ops and "<" in ops, f"{req}: needs a lower and an upper bound"
        if req.marker is not None and not req.marker.evaluate(linux):
            continue  # the macOS line of mlx; its Linux twin is pinned
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is required but constraints.txt does not pin it"
        assert req.specifier.contains(pins[name]), f"constraints.txt pins {req.name}=={pins[name]}, outside {req.specifier}"
        for extra in req.extras:  # mlx[cpu] -> mlx-cpu
            assert canonicalize_name(f"{req.name}-{extra}") in pins, f"{req.name}[{extra}] is not pinned"


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
        assert SpecifierSet(conda[name]) == req.specifier, req.name
    # Nothing in conda's list that pyproject does not ask for (besides python and pip).
    asked = {CONDA_NAMES.get(Requirement(x).name.lower(), Requirement(x).name.lower())
             for x in PYPROJECT["project"]["dependencies"] + optional["notebook"] + optional["test"]}
    assert set(conda) - asked == {"python", "pip"}
    # The pip section installs the package itself with every extra (MLX and JAX come from there).
    (line,) = pip
    extras = set(re.search(r"\[(.*)\]", line).group(1).split(","))
    assert line.startswith("-e ") and extras == {"all", "test"}
    all_extras = set(re.search(r"\[(.*)\]", optional["all"][0]).group(1).split(","))
    # Every extra is in `all` but the test tools and the CUDA builds (a CPU machine cannot install those).
    assert all_extras | {"all", "test", "cuda", "cuda13"} == set(optional)
    # The two CUDA extras differ in the CUDA major version alone.
    assert [x.replace("cuda13", "cuda12") for x in optional["cuda13"]] == optional["cuda"]
    # The pins of constraints.txt lie inside conda's bounds too.
    pins = pinned()
    pypi_name = {v: k for k, v in CONDA_NAMES.items()}
    for name, bound in conda.items():
        if name not in ("python", "pip"):
            pin = pins[canonicalize_name(pypi_name.get(name, name))]
            assert Requirement(f"{name}{bound}").specifier.contains(pin), f"{name}: pin {pin} outside {bound}"
    # The conda Python satisfies requires-python.
    version = conda["python"].lstrip("=")
    assert Requirement(f"python{PYPROJECT['project']['requires-python']}").specifier.contains(version + ".0")


def test_mlx_extra_is_cpu_build_on_linux():
    mlx = [Requirement(x) for x in PYPROJECT["project"]["optional-dependencies"]["mlx"]]
    linux = {r.name: r for r in mlx if r.marker.evaluate({"sys_platform": "linux"})}
    assert set(linux) == {"mlx", "scipy-openblas32"} and linux["mlx"].extras == {"cpu"}  # OpenBLAS under MLX


def test_a_failed_apt_get_still_runs_the_tests(tmp_path):
    # No mirror reachable: apt-get fails at once. scripts/test.sh runs under set -e, and its `need` must
    # say which tests will be skipped and go on to pytest instead of ending the script there.
    (tmp_path / "apt-get").write_text("#!/bin/sh\necho 'E: no mirror reachable' >&2\nexit 100\n")
    (tmp_path / "apt-get").chmod(0o755)
    script = (ROOT / "scripts" / "test.sh").read_text()
    need = re.search(r"^need\(\) \{\n.*?^\}\n", script, re.S | re.M).group(0)
    proc = subprocess.run(["bash", "-c", f"set -euo pipefail\n{need}\nneed no-such-tool-xyz 'no-such-package' 'Example'\n"
                           "echo reached-pytest"], capture_output=True, text=True, timeout=30,
                          env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert "the Example tests will be skipped" in proc.stdout and "reached-pytest" in proc.stdout


def test_the_test_command_prints_the_slowest_tests_and_runs_each_group_whole_on_two_workers():
    command = re.search(r"^python3 -m pytest .*$", (ROOT / "scripts" / "test.sh").read_text(), re.M).group(0)
    assert "--durations=25 " in command
    # --dist loadfile: each file whole on one worker, so a notebook's cells share one kernel; in conftest's order
    assert re.search(r' -n "\$\{WORKBENCH_TEST_WORKERS:-3\}" --dist loadfile --no-loadscope-reorder ', command)

"""The README as a newcomer reads it (issue 29, item 14): its code runs, its tree is the package, its counts
are counted. One process: the shell commands are checked here against the parsers and files they name;
``tests/test_readme_commands.py`` runs the ones that need their own process.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import io
import re
import shlex
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
PACKAGE = ROOT / "workbench"
#: Calls that start engines or ranks: a one-process test checks that the README's arguments bind to the
#: function's signature (every name, keyword and value evaluated), and the runs themselves are the
#: process tests' (test_training, test_collectives, test_multihost); the snippet's later lines then read
#: real stored runs (the committed reference runs), not what a stand-in returned.
STARTS_PROCESSES = ("run_training", "run_sweep", "run_collective_benchmark")


def blocks(language: str) -> list[str]:
    """The README's fenced code blocks in ``language``, in order."""
    found, current, lang = [], None, ""
    for line in README.splitlines(keepends=True):
        if line.startswith("```"):
            if current is None:
                current, lang = [], line[3:].strip()
            else:
                if lang == language:
                    found.append("".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return found


def tree_modules() -> dict[str, set[str]]:
    """The architecture tree: ``{folder: {module, ...}}`` (folders relative to ``workbench/``, ``""`` for a
    folder's own modules). Names in ``(+ a, b; words)`` are modules; other parentheticals are words."""
    tree = next(b for b in blocks("") if b.startswith("workbench/\n"))
    lines = tree.splitlines()[1:]
    width = max(len(line) for line in lines)
    column = next((c for c in range(14, width) if all(len(line) <= c or line[c - 2:c] == "  " for line in lines)
                   and any(len(line) > c for line in lines)), None)
    assert column, "the tree's descriptions start at one column, two spaces past its longest list of modules"
    text: dict[str, str] = {}
    for line in lines:
        if line[2:3].strip():
            folder = line[2:14].strip().rstrip("/")
            text[folder] = ""
        text[folder] += " " + line[14:column]
    found: dict[str, set[str]] = {}
    for folder, words in text.items():
        for sub, names in re.findall(r"(\w+)/\{([^}]*)\}", words):
            found[f"{folder}/{sub}"] = _names(names)
        words = re.sub(r"\w+/\{[^}]*\}", ",", words)
        found[folder] = _names(words)
    return found


def _names(words: str) -> set[str]:
    out, depth, kept = set(), 0, []
    for part in re.split(r"([()])", words):
        if part == "(":
            depth += 1
        elif part == ")":
            depth -= 1
        elif depth == 0:
            kept.append(part)
        elif part.lstrip().startswith("+"):
            out |= {n.strip() for n in part.lstrip()[1:].split(";")[0].split(",")}
    out |= {n.strip() for n in ",".join(kept).split(",")}
    return {n for n in out if n}


def package_modules() -> dict[str, set[str]]:
    return {str(d.relative_to(PACKAGE)): {p.stem for p in d.glob("*.py") if not p.stem.startswith("__")}
            for d in sorted(PACKAGE.rglob("*")) if d.is_dir() and (d / "__init__.py").exists()}


def test_the_architecture_tree_is_the_package():
    tree, package = tree_modules(), package_modules()
    folders = {f for f, names in package.items() if names}  # adapters/ holds only mlx/ and jax/
    assert set(tree) - {"adapters"} == folders, f"folders: tree {sorted(tree)}, package {sorted(folders)}"
    for folder in folders:
        assert tree[folder] == package[folder], (f"{folder}/: not in the tree {sorted(package[folder] - tree[folder])}, "
                                                 f"in the tree but not the package {sorted(tree[folder] - package[folder])}")


def test_the_counts_of_the_redesign_table_are_counted():
    files = sorted(PACKAGE.rglob("*.py"))
    lines = sum(len(p.read_text().splitlines()) for p in files)
    row = re.search(r"^\| modules \(lines\) \|.*?; (\d+) \(about ([\d,]+)\) now, `__init__.py` files included", README, re.M)
    assert row, "the modules row of the redesign table"
    assert int(row.group(1)) == len(files), f"{len(files)} modules"
    assert abs(int(row.group(2).replace(",", "")) - lines) <= 1000, f"{lines:,} lines"
    folders = [d for d in PACKAGE.rglob("*") if d.is_dir() and (d / "__init__.py").exists()]
    layers = [d for d in PACKAGE.iterdir() if d.is_dir() and (d / "__init__.py").exists()]
    row = re.search(r"^\| folders \|.*\| (\d+) \((\d+) layers", README, re.M)
    assert (int(row.group(1)), int(row.group(2))) == (len(folders), len(layers))


def test_the_notebook_table_lists_every_notebook():
    listed = re.findall(r"^\| `notebooks/([\w.]+\.ipynb)` \|", README, re.M)
    assert listed == sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))


def test_the_test_command_installs_what_the_readme_says():
    script = (ROOT / "scripts" / "test.sh").read_text()
    packages = " ".join(re.findall(r'^need \S+ "?([^"\n]+?)"? ', script, re.M)).split()
    said = re.search(r"The second installs what the\s+tests need \((.*?) from Debian", README, re.S).group(1)
    names = {"openmpi-bin": "OpenMPI", "libopenmpi-dev": "OpenMPI", "chromium": "Chromium"}
    assert packages and all(names.get(p, p) in said for p in packages), (packages, said)
    # "a failed apt says which tests will be skipped and goes on": under set -e only a guarded apt goes on
    assert "set -e" in script and re.search(r"if ! \{ apt-get update .*apt-get install", script)
    assert "a failed apt says which tests will be skipped and goes on" in " ".join(README.split())


def _bind(fn, *args, **kwargs):
    inspect.signature(fn).bind(*args, **kwargs)


class _Deferred(ast.NodeTransformer):
    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id in STARTS_PROCESSES:
            return ast.copy_location(ast.Call(ast.Name("_bind", ast.Load()), [node.func, *node.args], node.keywords), node)
        return node


def run_snippet(code: str, namespace: dict) -> None:
    tree = ast.fix_missing_locations(_Deferred().visit(ast.parse(code)))
    namespace["_bind"] = _bind
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(tree, "README.md", "exec"), namespace)  # noqa: S102 - the repository's own README


def _mlx_context() -> dict:
    """What the MLX snippets take as given: a small LM, its loss, a batch, an optimizer, the group of one."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim

    from workbench.models.init import LMConfig
    from workbench.models.mlx_lm import MLXLM, lm_loss

    mx.random.seed(0)
    model = MLXLM(LMConfig(vocab_size=64, seq_len=8, dim=16, num_layers=2, num_heads=2, mlp_dim=32))
    x = mx.random.randint(0, 64, (4, 8))
    y = mx.random.randint(0, 64, (4, 8))
    return dict(mx=mx, nn=nn, model=model, optimizer=optim.AdamW(1e-3), lm_loss=lm_loss, loss_fn=lm_loss,
                loss_and_grad=nn.value_and_grad(model, lm_loss), x=x, y=y, inputs=x, targets=y,
                group=mx.distributed.init())


def test_every_python_snippet_runs(tmp_path, monkeypatch):
    pytest.importorskip("mlx.core")
    snippets = blocks("python")
    assert len(snippets) >= 6
    monkeypatch.chdir(tmp_path)
    # "runs/mine" holds real runs: the committed reference runs of notebook 04's convergence study.
    shutil.copytree(ROOT / "notebooks" / "reference_runs" / "convergence", tmp_path / "runs" / "mine")
    namespace: dict = {}  # read in order, as a newcomer does: a snippet may use an earlier one's names
    for code in snippets:
        if re.search(r"\b(model|optimizer)\b", code):  # each MLX example starts from its own model and optimizer
            namespace.update(_mlx_context())
        run_snippet(code, namespace)
    for name in ("plan", "params", "grads", "trainer", "spec", "loaded"):
        assert name in namespace, f"no snippet defined {name!r}"
    assert len(namespace["loaded"].runs) >= 2 and not namespace["loaded"].problems


def test_the_hosts_file_example_is_read_as_the_readme_says(tmp_path):
    from workbench.launch.hosts import load_hosts

    toml = next(b for b in blocks("toml") if "[[hosts]]" in b)
    path = tmp_path / "hosts.toml"
    path.write_text(toml.replace('ssh_config = "~/.ssh/config"', "# ssh_config: checked in test_hosts_input"))
    hosts = load_hosts(path)
    assert [(h.address, h.slots) for h in hosts.hosts] == [("10.0.0.11", 2), ("10.0.0.12", 2)]


def commands() -> list[list[str]]:
    """Every command line the README shows: in ``bash`` blocks, in indented blocks, and inline."""
    text = "\n".join(blocks("bash")) + "\n" + "\n".join(re.findall(r"^    (python3? .*|bash .*)$", README, re.M))
    text += "\n" + "\n".join(re.findall(r"`((?:python3?|bash|pytest) [^`]+)`", README))
    out = []
    for line in text.splitlines():
        line = line.split("  #")[0].split(" # ")[0].strip()
        if re.match(r"(python3?|bash|pytest|sudo python3?) ", line):
            for part in line.split(" && "):
                out.append(shlex.split(part.replace("[", "").replace("]", "").replace("|", " ")))
    return out


def test_every_shell_command_names_a_real_program_and_real_flags():
    from workbench.__main__ import main

    cmds = commands()
    assert len(cmds) >= 15
    checked = set()
    for argv in cmds:
        argv = argv[1:] if argv[0] == "sudo" else argv
        if argv[0] in ("python", "python3") and argv[1:3] == ["-m", "workbench"]:
            sub, flags = argv[3], [a for a in argv[4:] if a.startswith("--")]
            out = io.StringIO()
            with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
                main([sub, "--help"])
            assert done.value.code == 0, argv
            missing = [f for f in flags if f not in out.getvalue()]
            assert not missing, f"{' '.join(argv)}: {missing} not among `workbench {sub}`'s options"
            for path in (a for a in argv[4:] if a.endswith(".ipynb") and "*" not in a):
                assert (ROOT / path).is_file(), path
        elif argv[0] in ("python", "python3") and argv[1] == "-m":
            module = argv[2]
            if module in ("pip", "pytest") or "<" in module:  # python -m programs.<name>: a placeholder
                continue
            assert (ROOT / Path(*module.split("."))).with_suffix(".py").is_file() or \
                (ROOT / "tests" / Path(*module.split("."))).with_suffix(".py").is_file(), module
        elif argv[0] in ("python", "python3", "bash"):
            script = ROOT / argv[1]  # a file, or a folder Python runs (its __main__.py)
            assert script.is_file() or (script / "__main__.py").is_file(), f"{' '.join(argv)}: no {argv[1]}"
            source = script.read_text() if script.is_file() else "".join(p.read_text() for p in script.glob("*.py"))
            missing = [f for f in argv[2:] if f.startswith("--") and f not in source]
            assert not missing, f"{' '.join(argv)}: {missing} not in {argv[1]}"
            checked.add(argv[1])
        elif argv[0] == "pytest":
            assert all((ROOT / a).exists() for a in argv[1:] if a.startswith("tests/")), argv
    assert {"scripts/test.sh", "scripts/hosts_rig", "scripts/fresh_check.sh"} <= checked

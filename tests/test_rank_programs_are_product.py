"""The package's rank programs are the product's: a program only tests start lives in tests/programs (issue 25)."""

import ast

from workbench.core.paths import REPO_ROOT

#: Where the product starts programs from: the package, the benchmarks, the scripts.
PRODUCT = ("workbench", "benchmarks", "scripts")


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of ``tree`` (a usage line in a docstring starts nothing)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def started_modules() -> set[str]:
    """Every string constant of product code, outside docstrings, that is a module path (``-m`` arguments)."""
    found = set()
    for folder in PRODUCT:
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            skip = docstrings(tree)
            found |= {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
                      and isinstance(node.value, str) and id(node) not in skip and node.value.startswith("workbench.")}
    return found


def rank_programs() -> set[str]:
    """The modules of workbench/ranks that run as programs (an ``if __name__ == "__main__"`` block)."""
    out = set()
    for path in sorted((REPO_ROOT / "workbench" / "ranks").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
                out.add(f"workbench.ranks.{path.stem}")
    return out


def test_every_rank_program_in_the_package_is_started_by_the_product():
    programs = rank_programs()
    assert {"workbench.ranks.entry", "workbench.ranks.mlx_step_timing"} <= programs  # the scan finds programs
    only_tests = sorted(programs - started_modules())
    assert not only_tests, (f"{only_tests} run only under the tests (no product code starts them by module path): "
                            "move them to tests/programs")


def test_the_scan_ignores_docstrings_and_reads_launch_arguments():
    tree = ast.parse('"""python -m workbench.ranks.x"""\ndef f():\n    """workbench.ranks.y"""\n'
                     '    return ["-m", "workbench.ranks.z"]\n')
    skip = docstrings(tree)
    assert [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and id(n) not in skip] == \
        ["-m", "workbench.ranks.z"]

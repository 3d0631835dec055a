"""The package's structure: layers import downward only, each definition exists once, names stay private."""

import ast
import functools
import sys
from collections import deque
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "workbench"
#: Lowest first: a layer imports only the layers before it (and itself).
LAYERS = ("core", "strategies", "estimate", "models", "adapters", "runs", "ranks", "launch", "views", "studies",
          "publish")
#: Layers that never import a framework, at module level or inside a function.
FRAMEWORK_FREE = ("core", "strategies", "estimate", "runs", "launch", "views", "studies", "publish")
#: Pure layers, lowest first: the standard library, NumPy and the pure layers up to their own, nothing else.
PURE = ("core", "strategies")
FRAMEWORKS = ("mlx", "jax", "jaxlib", "flax", "optax")
#: Groups of modules still importing each other, with why; an entry that no longer holds fails the test.
KNOWN_CIRCLES: dict[frozenset[str], str] = {}
#: Modules allowed over MAX_LINES, with why.
LONG_MODULES = {}
MAX_LINES = 320


@functools.cache
def modules() -> tuple[tuple[str, Path, ast.Module], ...]:
    """(dotted name, path, syntax tree) of every module of the package, each file parsed once per session."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found.append((name, path, ast.parse(path.read_text())))
    return tuple(found)


def imports(tree):
    """(line, module) of every import in ``tree``, at any depth; ``from a import b`` gives ``a.b`` too."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"relative import on line {node.lineno}: write workbench.<layer>.<module>"
            for alias in node.names:
                yield node.lineno, node.module, alias.name


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def import_graph(trees: dict[str, ast.Module]) -> dict[str, dict[str, int]]:
    """Which modules of ``trees`` each one imports, at any depth (function bodies too): name -> {name: line}.

    ``from a import b`` names the module ``a.b`` where there is one, else ``a`` (a name defined in ``a``).
    """
    graph = {}
    for name, tree in trees.items():
        edges = graph.setdefault(name, {})
        for line, module, imported in imports(tree):
            target = next((t for t in (f"{module}.{imported}" if imported else None, module) if t in trees), None)
            if target is not None and target != name:
                edges.setdefault(target, line)
    return graph


def import_cycles(graph: dict[str, dict[str, int]]) -> list[tuple[tuple[str, ...], list[str]]]:
    """Each group of modules that import each other (sorted names), with one shortest circle ``[a, b, ..., a]``
    through its first module (Tarjan's strongly connected components, then a breadth-first search)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    circles = []
    for group in sorted(groups, key=min):
        start = min(group)
        came_from, queue = {start: None}, deque([start])
        while queue:
            node = queue.popleft()
            if start in graph[node]:
                path = [node]
                while came_from[path[-1]] is not None:
                    path.append(came_from[path[-1]])
                circles.append((tuple(sorted(group)), [*reversed(path), start]))
                break
            for nxt in sorted(graph[node]):
                if nxt in group and nxt not in came_from:
                    came_from[nxt] = node
                    queue.append(nxt)
    return circles


def describe_circle(graph: dict[str, dict[str, int]], circle: list[str]) -> str:
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(circle, circle[1:])) + f" -> {circle[-1]}"


def test_every_module_lies_in_a_layer():
    loose = [name for name, path, _ in modules()
             if layer_of(name) is None and name not in ("workbench", "workbench.__main__")]
    assert not loose, f"modules outside the layers {LAYERS}: {loose}"


def test_layers_import_downward_only():
    wrong = []
    for name, _, tree in modules():
        mine = layer_of(name)
        for line, module, imported in imports(tree):
            target = layer_of(module) if module.startswith("workbench.") else None
            if module == "workbench" and imported:  # from workbench import x
                target = imported if imported in LAYERS else None
            if mine and target and LAYERS.index(target) > LAYERS.index(mine):
                wrong.append(f"{name}:{line} ({mine}) imports {module} ({target})")
            if mine == "adapters" and module.startswith("workbench.adapters."):
                if module.split(".")[2] != name.split(".")[2]:
                    wrong.append(f"{name}:{line} imports the other framework's adapter {module}")
    assert not wrong, "\n".join(wrong)


def test_only_adapters_models_and_ranks_import_a_framework():
    wrong = [f"{name}:{line} imports {module}" for name, _, tree in modules() if layer_of(name) in FRAMEWORK_FREE
             for line, module, _ in imports(tree) if module.split(".")[0] in FRAMEWORKS]
    wrong += [f"{name}:{line} imports {module}" for name, _, tree in modules()
              if name in ("workbench", "workbench.__main__")
              for line, module, _ in imports(tree) if module.split(".")[0] in FRAMEWORKS]
    assert not wrong, "\n".join(wrong)


def test_no_module_imports_another_modules_private_names():
    wrong = [f"{name}:{line} imports {module}.{imported}" for name, _, tree in modules()
             for line, module, imported in imports(tree)
             if module.startswith("workbench") and imported and imported.startswith("_") and module != name]
    assert not wrong, "\n".join(wrong)


def test_modules_stay_short():
    long = {name: n for name, path, _ in modules()
            if (n := len(path.read_text().splitlines())) > MAX_LINES and name not in LONG_MODULES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_the_import_direction_test_catches_an_upward_import(tmp_path, monkeypatch):
    """The checker itself: a core module importing a view is reported."""
    tree = ast.parse("from workbench.views.style import figure\n")
    found = [(line, module) for line, module, _ in imports(tree)]
    assert found == [(1, "workbench.views.style")]
    assert LAYERS.index(layer_of("workbench.views.style")) > LAYERS.index(layer_of("workbench.core.units"))
    with pytest.raises(AssertionError, match="relative import"):
        list(imports(ast.parse("from . import units\n")))


def test_no_modules_import_each_other():
    """No circle of imports inside the package (within a layer, where the downward rule allows both
    directions), function-level imports counted: a circle is a seam not yet cut."""
    graph = import_graph({name: tree for name, _, tree in modules()})
    found = dict(import_cycles(graph))
    wrong = [f"{describe_circle(graph, circle)} (modules importing each other: {', '.join(group)})"
             for group, circle in found.items() if frozenset(group) not in KNOWN_CIRCLES]
    wrong += [f"KNOWN_CIRCLES lists {sorted(group)}, which no longer import each other: drop the entry"
              for group in KNOWN_CIRCLES if tuple(sorted(group)) not in found]
    assert not wrong, "\n".join(wrong)


def test_the_circle_checker_reports_a_circle_through_a_function_level_import():
    """The checker itself: a -> b -> (inside a function) c -> a is one circle; d, importing a, is in none."""
    sources = {"workbench.x.a": "from workbench.x.b import f\n",
               "workbench.x.b": "import os\n\n\ndef g():\n    import workbench.x.c\n",
               "workbench.x.c": "from workbench.x import a\n",
               "workbench.x.d": "from workbench.x.a import z\nfrom workbench.core.units import MiB\n"}
    graph = import_graph({name: ast.parse(text) for name, text in sources.items()})
    assert graph["workbench.x.b"] == {"workbench.x.c": 5} and graph["workbench.x.c"] == {"workbench.x.a": 1}
    ((group, circle),) = import_cycles(graph)
    assert group == ("workbench.x.a", "workbench.x.b", "workbench.x.c")
    assert circle == ["workbench.x.a", "workbench.x.b", "workbench.x.c", "workbench.x.a"]
    assert describe_circle(graph, circle) == ("workbench.x.a (line 1) -> workbench.x.b (line 5) -> "
                                              "workbench.x.c (line 1) -> workbench.x.a")
    sources["workbench.x.b"] = "import os\n"  # the seam cut: no circle
    assert import_cycles(import_graph({name: ast.parse(text) for name, text in sources.items()})) == []


def impure_imports(name: str, tree: ast.Module) -> list[str]:
    """The imports of a module of a :data:`PURE` layer other than the standard library, NumPy and the pure
    layers up to its own (``workbench`` itself included: it loads every layer's planners)."""
    allowed = PURE[: PURE.index(layer_of(name)) + 1]
    wrong = []
    for line, module, _ in imports(tree):
        top = module.split(".")[0]
        if top == "workbench":
            ok = layer_of(module) in allowed
        else:
            ok = top in sys.stdlib_module_names or top == "numpy"
        if not ok:
            wrong.append(f"{name}:{line} ({layer_of(name)}) imports {module}")
    return wrong


def test_pure_layers_import_only_the_standard_library_numpy_and_pure_layers_below():
    wrong = [line for name, _, tree in modules() if layer_of(name) in PURE for line in impure_imports(name, tree)]
    assert not wrong, "\n".join(wrong)


def test_the_purity_checker_reports_what_a_strategy_record_may_not_import():
    """The checker itself: ``strategies`` may import core, itself, the standard library and NumPy; not a
    higher layer, not ``workbench``, not a third-party package (inside a function either); core not strategies."""
    fine = ("from __future__ import annotations\nimport dataclasses\nimport numpy as np\n"
            "from workbench.core.units import MiB\nfrom workbench.strategies import records\n")
    assert impure_imports("workbench.strategies.records", ast.parse(fine)) == []
    bad = ("from workbench.estimate.comm import STRATEGIES\nfrom workbench import plan_buckets\n"
           "def f():\n    import plotly\n")
    assert impure_imports("workbench.strategies.records", ast.parse(bad)) == [
        "workbench.strategies.records:1 (strategies) imports workbench.estimate.comm",
        "workbench.strategies.records:2 (strategies) imports workbench",
        "workbench.strategies.records:4 (strategies) imports plotly"]
    assert impure_imports("workbench.core.specs", ast.parse("from workbench.strategies import records\n")) == [
        "workbench.core.specs:1 (core) imports workbench.strategies"]
    assert LAYERS[:3] == ("core", "strategies", "estimate") and "strategies" in FRAMEWORK_FREE


def test_each_strategy_list_is_defined_once():
    import workbench.strategies as registry
    from workbench.estimate import comm, knobs
    from workbench.runs import spec

    assert comm.STRATEGIES is knobs.STRATEGIES is registry.NAMES
    assert spec.STRATEGIES is registry.RUN_NAMES
    assert set(registry.RUN_NAMES) <= set(registry.NAMES) and len(set(registry.NAMES)) == len(registry.NAMES)


def strategy_name_compares(tree: ast.AST, names: set[str]) -> list[int]:
    """Lines of ``tree`` that compare with a strategy's name (``== "ddp"``, ``in ("fsdp-row", ...)``) or
    parse one (``.split("-")`` of a strategy)."""
    def named(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in names
        return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(named(e) for e in node.elts)

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(named(x) for x in (node.left, *node.comparators)):
            lines.append(node.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "split"
              and "strategy" in ast.unparse(node.func.value)):
            lines.append(node.lineno)
    return sorted(lines)


def test_no_module_dispatches_on_a_strategy_name_outside_the_registry():
    """A strategy is a record (workbench.strategies): what it shards, its layout, its collectives. Code asks
    the record; comparing a name string would make a new strategy another branch in every caller."""
    import workbench.strategies as registry

    names = set(registry.NAMES)
    found = {name: lines for name, path, tree in modules() if layer_of(name) != "strategies"
             and (lines := strategy_name_compares(tree, names))}
    assert not found, f"strategy names compared outside workbench.strategies (ask the record): {found}"


def test_the_strategy_name_checker_finds_a_compare_and_a_parse():
    tree = ast.parse('if s == "ddp":\n    pass\nx = spec.strategy.split("-")[1]\nok = s == "rows"\n'
                     'y = s in ("fsdp-row", "other")\n')
    assert strategy_name_compares(tree, {"ddp", "fsdp-row"}) == [1, 3, 5]


def test_the_repository_root_is_computed_once():
    import ast
    from pathlib import Path

    from workbench.core import paths

    assert (paths.REPO_ROOT / "pyproject.toml").is_file() and paths.NOTEBOOK_DIR.is_dir()
    for module in sorted((paths.REPO_ROOT / "workbench").rglob("*.py")):
        if module.name == "paths.py" and module.parent.name == "core":
            continue
        # No other module climbs from its own file to the checkout (Path(__file__)...parent.parent).
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "parent" and isinstance(node.value, ast.Attribute) \
                    and node.value.attr == "parent":
                raise AssertionError(f"{module.relative_to(paths.REPO_ROOT)}:{node.lineno} computes the repository root; "
                                     "use workbench.core.paths")
    assert Path(paths.__file__).parents[2] == paths.REPO_ROOT


def test_sizes_are_written_with_the_units_of_workbench_units():
    import re

    from workbench.core import paths

    literal = re.compile(r"\b\d+ \* 2 ?\*\* ?20\b")
    for module in sorted((paths.REPO_ROOT / "workbench").rglob("*.py")):
        hits = [i for i, line in enumerate(module.read_text().splitlines(), 1) if literal.search(line)]
        assert not hits, f"{module.relative_to(paths.REPO_ROOT)} lines {hits}: write N * MiB (workbench.core.units)"


def test_one_optimizer_factory_per_framework():
    import mlx.optimizers as optim
    import optax
    import pytest

    from workbench.adapters.jax import base as jax_adapter
    from workbench.adapters.mlx import base as mlx_adapter

    adamw = mlx_adapter.make_optimizer("adamw", 3e-3, weight_decay=0.1)
    assert isinstance(adamw, optim.AdamW) and adamw.bias_correction and adamw.weight_decay == 0.1
    assert isinstance(mlx_adapter.make_optimizer("sgd", 0.5), optim.SGD)
    assert isinstance(jax_adapter.make_optimizer("adamw", 3e-3, weight_decay=0.1), optax.GradientTransformation)
    for module in (mlx_adapter, jax_adapter):
        with pytest.raises(ValueError, match="'lion'.*adamw, sgd"):
            module.make_optimizer("lion", 1e-3)


def test_the_public_api_imports_from_the_package_and_loads_frameworks_lazily():
    import subprocess
    import sys

    code = ("import sys, workbench\n"
            "from workbench import plan_buckets, plan_shards, ModelSpec\n"
            "assert not [m for m in sys.modules if m.split('.')[0] in ('mlx', 'jax', 'ipyparallel')], 'eager'\n"
            "from workbench import RunSpec, run_training, fsdp_apply_gradients\n"
            "from workbench.runs.spec import RunSpec as R\n"
            "from workbench.launch.driver import run_training as T\n"
            "from workbench.adapters.mlx.fsdp import fsdp_apply_gradients as F\n"
            "assert (RunSpec, run_training, fsdp_apply_gradients) == (R, T, F)\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        import workbench

        workbench.nope


def test_every_registered_implementation_names_a_builder_that_exists():
    """A record names its adapter's builder as 'module:attribute'; a moved builder must not leave it dangling.
    Found by name only (the module's source), so no framework is imported here."""
    import workbench.strategies as registry

    trees = {name: tree for name, _, tree in modules()}
    missing = []
    for record in registry.strategies():
        for impl in record.implementations:
            module, _, attribute = impl.builder.partition(":")
            defined = {n.name for n in ast.walk(trees.get(module, ast.Module(body=[], type_ignores=[])))
                       if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
            if attribute not in defined:
                missing.append(f"{record.name} ({impl.framework}): {impl.builder}")
    assert not missing, f"builders that do not exist: {missing}"

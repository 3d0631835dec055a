"""The package's structure: layers import downward only, each definition exists once, names stay private."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "workbench"
#: Lowest first: a layer imports only the layers before it (and itself).
LAYERS = ("core", "estimate", "models", "adapters", "runs", "ranks", "launch", "views", "studies", "publish")
#: Layers that never import a framework, at module level or inside a function.
FRAMEWORK_FREE = ("core", "estimate", "runs", "launch", "views", "studies", "publish")
FRAMEWORKS = ("mlx", "jax", "jaxlib", "flax", "optax")
#: Modules allowed over MAX_LINES, with why.
LONG_MODULES = {}
MAX_LINES = 320


def modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, path, ast.parse(path.read_text())


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


def test_each_strategy_list_is_defined_once():
    from workbench.core import strategies
    from workbench.estimate import comm, knobs
    from workbench.runs import spec

    assert comm.STRATEGIES is knobs.STRATEGIES is strategies.MODEL_STRATEGIES
    assert spec.STRATEGIES is strategies.RUN_STRATEGIES
    assert set(strategies.MODEL_STRATEGY) == set(strategies.RUN_STRATEGIES)
    assert set(strategies.MODEL_STRATEGY.values()) <= set(strategies.MODEL_STRATEGIES)


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

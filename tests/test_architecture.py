"""The package's structure: each definition exists once."""


def test_each_strategy_list_is_defined_once():
    from workbench.core import strategies
    from workbench.estimate import comm, memory
    from workbench.launch import driver as training
    from workbench.runs import estimate as validation

    assert comm.STRATEGIES is memory.STRATEGIES is strategies.MODEL_STRATEGIES
    assert training.STRATEGIES is strategies.RUN_STRATEGIES
    assert set(strategies.MODEL_STRATEGY) == set(strategies.RUN_STRATEGIES)
    assert set(strategies.MODEL_STRATEGY.values()) <= set(strategies.MODEL_STRATEGIES)
    assert validation.MODEL_STRATEGY is strategies.MODEL_STRATEGY


def test_the_repository_root_is_computed_once():
    import ast
    from pathlib import Path

    from workbench.core import paths

    assert (paths.REPO_ROOT / "pyproject.toml").is_file() and paths.NOTEBOOK_DIR.is_dir()
    for module in sorted((paths.REPO_ROOT / "workbench").rglob("*.py")):
        if module.name == "paths.py":
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

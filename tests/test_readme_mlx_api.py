"""The README's MLX API sections say what the code does (issue 28): which MLX release has which FSDP API and which
the workbench runs, every strategy a run can name, and imports of the package that work. One process."""

import importlib
import re
from pathlib import Path

import pytest

from workbench.core.fully_shard_migration import MLX_FSDP_APIS
from workbench.strategies import RUN_NAMES

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def paragraph(start: str) -> str:
    """The README's paragraph (up to the next blank line) that starts with ``start``."""
    at = README.index(start)
    end = README.find("\n\n", at)
    return " ".join(README[at:end].split())


def test_which_mlx_has_which_api_agrees_with_the_registry_and_the_pin():
    text = paragraph("**Which MLX has which API.**")
    first, last = MLX_FSDP_APIS["fsdp_apply_gradients"]
    assert f"`mlx.nn.fsdp_apply_gradients` (PR #3130, hybrid groups #3194) shipped up to {last}" in text
    assert f"removed by PR #3768, first shipped in {MLX_FSDP_APIS['fully_shard'][0]}" in text
    assert MLX_FSDP_APIS["fully_shard"][0] == MLX_FSDP_APIS["clip_grad_norm_sharded"][0]
    pin = re.search(r"^mlx==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M).group(1)
    assert f"pins mlx {pin} and runs both" in text
    assert "conformance-tested against MLX v0.32.0's own in `tests/test_mlx_fsdp.py`" in text
    assert "mlx_v0320_fsdp_apply_gradients" in (ROOT / "tests/test_mlx_fsdp.py").read_text()


def test_the_run_strategy_fully_shard_is_documented_as_it_runs():
    text = paragraph('`RunSpec(strategy="mlx-fully-shard")` trains')
    assert "Not yet" not in README[README.index("**Which MLX has which API.**"):README.index("JAX: `workbench")]
    for claim in ("MLX >= 0.32.1", "supply_sum_scatter(group)", "naming `sum_scatter` and the backend",
                  "`defer_sync=False` with `num_microbatches > 1`", "MLX only; JAX refuses it",
                  "workbench.studies.fully_shard.fully_shard_comparison"):
        assert claim in text, claim
    # what it says RunSpec does, RunSpec does
    from workbench.runs.spec import RunSpec

    with pytest.raises(ValueError, match="defer_sync"):
        RunSpec(framework="mlx", strategy="mlx-fully-shard", num_microbatches=2, defer_sync=True)
    with pytest.raises(ValueError, match="strategy"):
        RunSpec(framework="jax", strategy="mlx-fully-shard")


def test_every_strategy_a_run_can_name_is_listed():
    text = paragraph("- `RunSpec` is validated before any engine starts")
    listed = re.search(r"Strategies: (.*?)\. `num_microbatches", text).group(1)
    assert sorted(set(re.findall(r"`([a-z0-9-]+)`", listed)) & set(RUN_NAMES)) == sorted(RUN_NAMES)


def test_every_package_import_in_the_readme_imports():
    lines = re.findall(r"^from (workbench[\w.]*) import ([\w, ]+)", README, re.M)
    assert len(lines) >= 8
    for module, names in lines:
        imported = importlib.import_module(module)
        for name in (n.strip() for n in names.split(",")):
            assert hasattr(imported, name), f"README: from {module} import {name}"

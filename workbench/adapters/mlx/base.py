"""MLX adapter: parameter specs from real MLX modules and parameter trees."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from workbench.core.specs import ModelSpec, spec_from_flat


def spec_from_mlx(model_or_tree: Any, name: str | None = None, *, trainable_only: bool = True) -> ModelSpec:
    """Describe an MLX module or parameter tree, in ``mlx.utils.tree_flatten`` order.

    That order is the one ``mlx.nn.average_gradients`` and FSDP steps walk, so a
    bucket plan of this spec is the plan MLX realises.

    Args:
        model_or_tree: An ``mlx.nn.Module`` or a tree (dicts / lists) of ``mx.array``.
        name: Label; default the module's class name, or ``"mlx-tree"``.
        trainable_only: For a module, describe ``trainable_parameters()`` (what
            gradients cover) rather than ``parameters()``.
    """
    if isinstance(model_or_tree, nn.Module):
        tree = model_or_tree.trainable_parameters() if trainable_only else model_or_tree.parameters()
        name = name or type(model_or_tree).__name__
    else:
        tree = model_or_tree
        name = name or "mlx-tree"
    items = []
    for path, leaf in tree_flatten(tree):
        if not isinstance(leaf, mx.array):
            raise ValueError(f"Leaf '{path}' of the MLX tree is a {type(leaf).__name__}, not an mx.array.")
        items.append((path, leaf.shape, leaf.dtype))
    return spec_from_flat(items, name)


OPTIMIZERS = ("adamw", "sgd")


def make_optimizer(name: str, learning_rate: float, *, weight_decay: float = 0.0, bias_correction: bool = True):
    """The workbench's MLX optimizer ``name``: ``"adamw"`` (``optim.AdamW``; with ``bias_correction`` its
    arithmetic is optax's ``adamw``) or ``"sgd"`` (``optim.SGD``, no momentum).

    Raises:
        ValueError: an unknown ``name``.
    """
    import mlx.optimizers as optim

    if name == "adamw":
        return optim.AdamW(learning_rate, weight_decay=weight_decay, bias_correction=bias_correction)
    if name == "sgd":
        return optim.SGD(learning_rate)
    raise ValueError(f"Unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}.")

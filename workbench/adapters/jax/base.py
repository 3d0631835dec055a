"""JAX adapter: parameter specs from pytrees and flax NNX modules, without allocating."""

from __future__ import annotations

from typing import Any

import jax

from workbench.core.specs import ModelSpec, spec_from_flat


def _key_name(key: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def spec_from_jax(tree_or_fn: Any, *args: Any, name: str = "jax-tree", **kwargs: Any) -> ModelSpec:
    """Describe a JAX pytree in ``jax.tree_util`` flatten order.

    Args:
        tree_or_fn: A pytree of arrays or ``jax.ShapeDtypeStruct``; or a function
            returning one, which is traced with ``jax.eval_shape(fn, *args, **kwargs)``
            so nothing is allocated (a 70B initialiser is fine).
        name: Label for the spec.
    """
    tree = jax.eval_shape(tree_or_fn, *args, **kwargs) if callable(tree_or_fn) else tree_or_fn
    items = []
    for keys, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        parts = [_key_name(k) for k in keys]
        if len(parts) > 1 and parts[-1] == "value":  # flax NNX Variable boxes
            parts.pop()
        path = ".".join(parts) or "value"
        if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
            raise ValueError(f"Leaf '{path}' of the JAX tree is a {type(leaf).__name__}, not an array.")
        items.append((path, leaf.shape, leaf.dtype))
    return spec_from_flat(items, name)


def spec_from_nnx(model_or_factory: Any, name: str | None = None, *, wrt: Any = None) -> ModelSpec:
    """Describe a flax NNX module's parameters (``nnx.Param`` by default).

    Args:
        model_or_factory: An ``nnx.Module``, or a zero-argument function building
            one; the function runs under ``nnx.eval_shape``, so no weights are allocated.
        name: Label; default the module's class name.
        wrt: The variable filter (default ``nnx.Param``).
    """
    from flax import nnx

    if isinstance(model_or_factory, nnx.Module):
        model = model_or_factory
    elif callable(model_or_factory):
        model = nnx.eval_shape(model_or_factory)
    else:
        raise ValueError(f"spec_from_nnx needs an nnx.Module or a function building one, got {type(model_or_factory).__name__}.")
    state = nnx.state(model, wrt if wrt is not None else nnx.Param)
    return spec_from_jax(state, name=name or type(model).__name__)


OPTIMIZERS = ("adamw", "sgd")


def make_optimizer(name: str, learning_rate: float, *, weight_decay: float = 0.0):
    """The workbench's optax optimizer ``name``: ``"adamw"`` (``optax.adamw``: the same betas, eps, bias
    correction and decoupled decay as MLX's ``AdamW(bias_correction=True)``) or ``"sgd"`` (``optax.sgd``).

    Raises:
        ValueError: an unknown ``name``.
    """
    import optax

    if name == "adamw":
        return optax.adamw(learning_rate, weight_decay=weight_decay)
    if name == "sgd":
        return optax.sgd(learning_rate)
    raise ValueError(f"Unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}.")

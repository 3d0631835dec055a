"""A plain MLP in JAX: the model of the JAX step-time benchmark and of the multi-process FSDP checks.

Parameters are a dict ``{"l{i}": {"w": (d_in, d_out), "b": (d_out,)}}`` used as ``h @ w + b``,
tanh between layers, mean squared error. :func:`build_problem` needs only NumPy; JAX is imported
when the loss is traced.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["build_problem", "mlp_loss"]


def build_problem(seed: int = 0, batch_size: int = 16, dims: tuple[int, ...] = (8, 16, 4)) -> tuple[dict, tuple]:
    """A deterministic MLP and global batch, as float32 NumPy arrays.

    Args:
        seed: NumPy seed of the weights and the batch.
        batch_size: Rows of the global batch.
        dims: Widths, input first: ``len(dims) - 1`` layers.

    Returns:
        ``(params, (x, y))``: ``params["l{i}"] = {"w": (d_i, d_{i+1}), "b": (d_{i+1},)}``,
        x of shape (batch_size, dims[0]), y of shape (batch_size, dims[-1]).
    """
    rng = np.random.default_rng(seed)
    params = {
        f"l{i}": {"w": (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32),
                  "b": (0.1 * rng.standard_normal(b)).astype(np.float32)}
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:]))
    }
    x = rng.standard_normal((batch_size, dims[0])).astype(np.float32)
    y = rng.standard_normal((batch_size, dims[-1])).astype(np.float32)
    return params, (x, y)


def mlp_loss(params: Any, batch: Any) -> Any:
    """Mean squared error of a tanh MLP (``params`` as :func:`build_problem`) on ``batch = (x, y)``, a scalar."""
    import jax.numpy as jnp

    x, y = batch
    h = x
    for i in range(len(params)):
        h = h @ params[f"l{i}"]["w"] + params[f"l{i}"]["b"]
        if i < len(params) - 1:
            h = jnp.tanh(h)
    return jnp.mean((h - y) ** 2)

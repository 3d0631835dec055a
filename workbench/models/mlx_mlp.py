"""A plain MLP in MLX: the model of the MLX step-time benchmark and of the FSDP-equals-DDP checks.

Parameters are a tree ``{"layers": [{"weight": (d_out, d_in), "bias": (d_out,)}, ...]}`` (MLX's
``nn.Linear`` layout, used as ``h @ W.T + b``), seeded from NumPy so every rank and every framework
starts from the same numbers; exact (erf) GELU between layers, float32 mean squared error.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np

__all__ = ["build_params", "mlp_loss"]


def build_params(dims: tuple[int, ...], seed: int, dtype) -> dict:
    """MLP parameters from a NumPy seed (identical on every rank and in every framework).

    Args:
        dims: Widths, input first: ``len(dims) - 1`` layers, layer i maps ``dims[i]`` to ``dims[i + 1]``.
        seed: NumPy seed; weights are normal with standard deviation ``d_in ** -0.5``, biases 0.1.
        dtype: MLX dtype of every array (drawn in float32, then cast).

    Returns:
        ``{"layers": [{"weight": (d_out, d_in), "bias": (d_out,)}, ...]}``.
    """
    rng = np.random.default_rng(seed)
    layers = []
    for d_in, d_out in zip(dims[:-1], dims[1:]):
        layers.append({
            "weight": mx.array(rng.normal(0, d_in**-0.5, (d_out, d_in)).astype(np.float32)).astype(dtype),
            "bias": mx.array(rng.normal(0, 0.1, (d_out,)).astype(np.float32)).astype(dtype),
        })
    return {"layers": layers}


def mlp_loss(params: dict, x: mx.array, y: mx.array) -> mx.array:
    """Mean squared error of the MLP on ``x`` (batch, dims[0]) against ``y`` (batch, dims[-1]), a float32 scalar."""
    h = x
    layers = params["layers"]
    for i, layer in enumerate(layers):
        h = h @ layer["weight"].T + layer["bias"]
        if i < len(layers) - 1:
            h = nn.gelu(h)
    return ((h.astype(mx.float32) - y) ** 2).mean()

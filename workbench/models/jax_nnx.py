"""The LM of :mod:`workbench.models.jax_lm` as a flax NNX module: :class:`JaxLM` holds the same ``nnx.Param``
leaves at the dotted paths of :func:`~workbench.models.init.init_lm_params`, and its ``__call__`` runs
:func:`~workbench.models.jax_lm.lm_logits_fn`. Apart from the functions so that a rank, which trains the
functions, never imports flax.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from workbench.models.init import LMConfig, init_lm_params, lm_param_shapes
from workbench.models.jax_lm import Params, lm_logits_fn

__all__ = ["JaxLM", "load_params", "params_from_model"]


class _Weights(nnx.Module):
    """A container of one ``weight`` parameter (a norm, an embedding or an ``(out, in)`` matrix)."""

    def __init__(self, value: np.ndarray):
        self.weight = nnx.Param(jnp.asarray(value))


class _Attention(nnx.Module):
    def __init__(self, p: dict[str, np.ndarray], prefix: str):
        self.wq, self.wk, self.wv, self.wo = (_Weights(p[f"{prefix}{n}.weight"]) for n in ("wq", "wk", "wv", "wo"))


class _MLP(nnx.Module):
    def __init__(self, p: dict[str, np.ndarray], prefix: str):
        self.w_in, self.w_out = _Weights(p[prefix + "w_in.weight"]), _Weights(p[prefix + "w_out.weight"])


class _Block(nnx.Module):
    def __init__(self, p: dict[str, np.ndarray], prefix: str):
        self.attn_norm = _Weights(p[prefix + "attn_norm.weight"])
        self.attn = _Attention(p, prefix + "attn.")
        self.mlp_norm = _Weights(p[prefix + "mlp_norm.weight"])
        self.mlp = _MLP(p, prefix + "mlp.")


class JaxLM(nnx.Module):
    """NNX module holding the LM's parameters at the dotted paths of ``init_lm_params``.

    Args:
        config: The model shape.
        seed: NumPy seed of :func:`~workbench.models.init.init_lm_params`; the same seed
            gives the same weights as ``mlx_lm.load_params(MLXLM(config), init_lm_params(config, seed))``.
    """

    def __init__(self, config: LMConfig, *, seed: int = 0):
        self.config = config
        p = init_lm_params(config, seed)
        self.embed, self.pos_embed = _Weights(p["embed.weight"]), _Weights(p["pos_embed.weight"])
        self.layers = nnx.List([_Block(p, f"layers.{i}.") for i in range(config.num_layers)])
        self.norm = _Weights(p["norm.weight"])
        if not config.tie_embeddings:
            self.head = _Weights(p["head.weight"])

    def __call__(self, inputs: jax.Array) -> jax.Array:
        """Logits (B, T, V) from ``inputs`` (B, T) int tokens, via :func:`lm_logits_fn`."""
        return lm_logits_fn(params_from_model(self), inputs, config=self.config)


def _param(model: JaxLM, path: str) -> nnx.Param:
    node = model
    for part in path.split("."):
        node = node[int(part)] if part.isdigit() else getattr(node, part)
    return node


def params_from_model(model: JaxLM) -> Params:
    """The module's parameters as a flat ``{dotted path: array}`` dict, in ``init_lm_params`` order."""
    return {path: _param(model, path)[...] for path in lm_param_shapes(model.config)}


def load_params(model: JaxLM, params: dict[str, np.ndarray | jax.Array]) -> JaxLM:
    """Copy a flat dict (``init_lm_params``, or :func:`params_from_model` after a step) into ``model``.

    Raises:
        ValueError: if a path is missing or extra, or a shape differs; the message names it.
    """
    shapes = lm_param_shapes(model.config)
    if missing := shapes.keys() - params.keys():
        raise ValueError(f"Parameters missing from the dict: {sorted(missing)}.")
    if extra := params.keys() - shapes.keys():
        raise ValueError(f"Parameters not in the model: {sorted(extra)}.")
    for path, shape in shapes.items():
        if tuple(params[path].shape) != shape:
            raise ValueError(f"Parameter '{path}' has shape {tuple(params[path].shape)}, the model needs {shape}.")
        _param(model, path).set_value(jnp.asarray(params[path]))
    return model

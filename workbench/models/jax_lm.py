"""The language model of :mod:`workbench.models.init` in JAX: pure functions and a flax NNX module.

The math lives in pure functions of a flat ``{dotted path: array}`` dict
(:func:`lm_logits_fn`, :func:`lm_loss_fn`), which is what ``shard_map`` FSDP steps
differentiate. :class:`JaxLM` is an NNX container of the same ``nnx.Param`` leaves whose
``__call__`` runs those functions, so both give the same numbers by construction.

Note that ``jax.tree_util`` flattens a dict in sorted key order (``layers.10`` before
``layers.2``), and NNX states sort attribute names; only the dicts returned here keep the
order of :func:`~workbench.models.init.init_lm_params`.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from workbench.models.init import RMS_NORM_EPS, LMConfig, init_lm_params, lm_param_shapes

__all__ = ["JaxLM", "lm_logits_fn", "lm_loss_fn", "load_params", "make_loss_fn", "params_from_model"]

Params = dict[str, jax.Array]


def rms_norm(x: jax.Array, weight: jax.Array) -> jax.Array:
    """``x / sqrt(mean(x**2, -1) + 1e-5) * weight``; ``x`` (..., D), ``weight`` (D,)."""
    return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + RMS_NORM_EPS) * weight


def attention(p: Params, prefix: str, x: jax.Array, num_heads: int) -> jax.Array:
    """Causal multi-head self-attention, no biases, softmax in fp32; ``x`` (B, T, D) -> (B, T, D)."""
    b, t, d = x.shape

    def heads(y: jax.Array) -> jax.Array:  # (B, T, D) -> (B, H, T, D/H)
        return y.reshape(b, t, num_heads, d // num_heads).transpose(0, 2, 1, 3)

    q, k, v = (heads(x @ p[f"{prefix}{n}.weight"].T) for n in ("wq", "wk", "wv"))
    scores = (q @ k.transpose(0, 1, 3, 2)).astype(jnp.float32) * (1.0 / math.sqrt(d // num_heads))
    scores = jnp.where(jnp.tril(jnp.ones((t, t), dtype=bool)), scores, -jnp.inf)
    weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return (weights @ v).transpose(0, 2, 1, 3).reshape(b, t, d) @ p[prefix + "wo.weight"].T


def block(p: Params, prefix: str, x: jax.Array, num_heads: int) -> jax.Array:
    """Pre-norm block ``layers.{i}.`` (``prefix``): attention then exact-GELU MLP; (B, T, D) -> (B, T, D)."""
    x = x + attention(p, prefix + "attn.", rms_norm(x, p[prefix + "attn_norm.weight"]), num_heads)
    hidden = jax.nn.gelu(rms_norm(x, p[prefix + "mlp_norm.weight"]) @ p[prefix + "mlp.w_in.weight"].T,
                         approximate=False)
    return x + hidden @ p[prefix + "mlp.w_out.weight"].T


def lm_logits_fn(params: Params, inputs: jax.Array, *, config: LMConfig) -> jax.Array:
    """Next-token logits (B, T, V) from ``inputs`` (B, T) int tokens, T <= ``config.seq_len``."""
    t = inputs.shape[1]
    if t > config.seq_len:
        raise ValueError(f"inputs has {t} positions, more than LMConfig.seq_len ({config.seq_len}).")
    x = params["embed.weight"][inputs] + params["pos_embed.weight"][:t]
    for i in range(config.num_layers):
        x = block(params, f"layers.{i}.", x, config.num_heads)
    x = rms_norm(x, params["norm.weight"])
    return x @ params["embed.weight" if config.tie_embeddings else "head.weight"].T


def lm_loss_fn(params: Params, inputs: jax.Array, targets: jax.Array, *, config: LMConfig) -> jax.Array:
    """Mean next-token cross-entropy in fp32 (nats per token).

    Args:
        params: Flat ``{dotted path: array}`` dict with the keys of ``init_lm_params(config, seed)``.
        inputs: (B, T) int tokens.
        targets: (B, T) int tokens, the token after each input position.
        config: The model shape (``num_heads`` cannot be read from the shapes).

    Returns:
        Scalar float32 loss.
    """
    logits = lm_logits_fn(params, inputs, config=config).astype(jnp.float32)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked)


def make_loss_fn(config: LMConfig) -> Callable[[Params, tuple[jax.Array, jax.Array]], jax.Array]:
    """``loss_fn(params, (inputs, targets))``, the signature ``make_fsdp_step`` / ``make_ddp_step`` take."""

    def loss_fn(params: Params, batch: tuple[jax.Array, jax.Array]) -> jax.Array:
        inputs, targets = batch
        return lm_loss_fn(params, inputs, targets, config=config)

    return loss_fn


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

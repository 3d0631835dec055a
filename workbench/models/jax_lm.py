"""The language model of :mod:`workbench.models.init` in JAX: pure functions (its NNX module: ``jax_nnx``).

The math lives in pure functions of a flat ``{dotted path: array}`` dict
(:func:`lm_logits_fn`, :func:`lm_loss_fn`), which is what ``shard_map`` FSDP steps
differentiate. :class:`JaxLM` is an NNX container of the same ``nnx.Param`` leaves whose
``__call__`` runs those functions, so both give the same numbers by construction; it lives in
:mod:`workbench.models.jax_nnx`, so that a JAX rank, which trains the functions, never imports flax (0.37 CPU-s
of every rank process).

Note that ``jax.tree_util`` flattens a dict in sorted key order (``layers.10`` before
``layers.2``), and NNX states sort attribute names; only the dicts returned here keep the
order of :func:`~workbench.models.init.init_lm_params`.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp

from workbench.models.init import RMS_NORM_EPS, LMConfig

__all__ = ["lm_logits_fn", "lm_loss_fn", "make_loss_fn"]

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


"""The language model of :mod:`workbench.models.init` in MLX.

``tree_flatten(MLXLM(config).trainable_parameters())`` lists exactly the paths of
:func:`~workbench.models.init.init_lm_params`, in the same order, so
``workbench.adapters.mlx.base.spec_from_mlx(model)`` and MLX FSDP steps walk that order.
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from workbench.models.init import RMS_NORM_EPS, LMConfig

__all__ = ["MLXLM", "load_params", "lm_loss"]


class Attention(nn.Module):
    """Causal multi-head self-attention without biases; softmax in fp32."""

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        """Map ``x`` (B, T, D) to (B, T, D)."""
        b, t, d = x.shape
        h = self.num_heads

        def heads(y: mx.array) -> mx.array:  # (B, T, D) -> (B, H, T, D/H)
            return y.reshape(b, t, h, d // h).transpose(0, 2, 1, 3)

        q, k, v = heads(self.wq(x)), heads(self.wk(x)), heads(self.wv(x))
        scores = (q @ k.transpose(0, 1, 3, 2)).astype(mx.float32) * (1.0 / math.sqrt(d // h))
        causal = mx.tril(mx.ones((t, t), dtype=mx.bool_))
        scores = mx.where(causal, scores, mx.array(-mx.inf, dtype=mx.float32))
        weights = mx.softmax(scores, axis=-1).astype(v.dtype)
        return self.wo((weights @ v).transpose(0, 2, 1, 3).reshape(b, t, d))


class MLP(nn.Module):
    """``w_out(gelu(w_in(x)))`` with the exact (erf) GELU."""

    def __init__(self, dim: int, mlp_dim: int):
        super().__init__()
        self.w_in = nn.Linear(dim, mlp_dim, bias=False)
        self.w_out = nn.Linear(mlp_dim, dim, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        """Map ``x`` (B, T, D) to (B, T, D)."""
        return self.w_out(nn.gelu(self.w_in(x)))


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, config: LMConfig):
        super().__init__()
        self.attn_norm = nn.RMSNorm(config.dim, eps=RMS_NORM_EPS)
        self.attn = Attention(config.dim, config.num_heads)
        self.mlp_norm = nn.RMSNorm(config.dim, eps=RMS_NORM_EPS)
        self.mlp = MLP(config.dim, config.mlp_dim)

    def __call__(self, x: mx.array) -> mx.array:
        """Map ``x`` (B, T, D) to (B, T, D)."""
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class MLXLM(nn.Module):
    """Decoder-only LM. Weights start from MLX's default init; use :func:`load_params`.

    Args:
        config: The model shape.
    """

    def __init__(self, config: LMConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.dim)
        self.pos_embed = nn.Embedding(config.seq_len, config.dim)
        self.layers = [Block(config) for _ in range(config.num_layers)]
        self.norm = nn.RMSNorm(config.dim, eps=RMS_NORM_EPS)
        if not config.tie_embeddings:
            self.head = nn.Linear(config.dim, config.vocab_size, bias=False)

    def __call__(self, inputs: mx.array) -> mx.array:
        """Logits (B, T, V) of the next token, from ``inputs`` (B, T) int tokens, T <= seq_len."""
        t = inputs.shape[1]
        if t > self.config.seq_len:
            raise ValueError(f"inputs has {t} positions, more than LMConfig.seq_len ({self.config.seq_len}).")
        x = self.embed(inputs) + self.pos_embed.weight[:t]
        for layer in self.layers:
            x = layer(x)
        x = self.norm(x)
        return self.embed.as_linear(x) if self.config.tie_embeddings else self.head(x)


def load_params(model: MLXLM, params: dict[str, np.ndarray]) -> MLXLM:
    """Copy a flat ``{dotted path: array}`` dict (e.g. ``init_lm_params``) into ``model``.

    Raises:
        ValueError: if a path is missing or extra, or a shape differs (from ``load_weights``).
    """
    model.load_weights([(path, mx.array(value)) for path, value in params.items()], strict=True)
    mx.eval(model.parameters())
    return model


def lm_loss(model: MLXLM, inputs: mx.array, targets: mx.array) -> mx.array:
    """Mean next-token cross-entropy in fp32.

    Args:
        model: The LM.
        inputs: (B, T) int tokens.
        targets: (B, T) int tokens, the token after each input position.

    Returns:
        Scalar float32 loss (nats per token).
    """
    logits = model(inputs).astype(mx.float32)
    picked = mx.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return mx.mean(mx.logsumexp(logits, axis=-1) - picked)

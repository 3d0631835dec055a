"""A small decoder-only language model: its config, parameter layout and seeded initialisation.

Pure NumPy, so MLX (:mod:`workbench.models.mlx_lm`) and JAX (:mod:`workbench.models.jax_lm`)
start from bit-identical weights. The architecture both adapters implement:

* ``h = embed[tokens] + pos_embed[:T]`` (learned absolute positions);
* ``num_layers`` pre-norm blocks: ``h += attn(rms_norm(h))``, ``h += mlp(rms_norm(h))``,
  with causal multi-head attention (no biases, scale ``1/sqrt(head_dim)``, softmax in
  fp32) and an exact-erf GELU MLP;
* ``logits = rms_norm(h) @ head.T`` (or ``@ embed.T`` when ``tie_embeddings``);
* loss: mean next-token cross-entropy over every position, in fp32.

RMSNorm is ``x / sqrt(mean(x**2) + 1e-5) * weight``. Every matrix is ``(out, in)`` and is
applied as ``x @ W.T``.

Sharding constraint: every array has ``dim`` as a factor of its size (vectors are
``(dim,)``, matrices ``(*, dim)`` or ``(dim, *)``), so when ``dim % N == 0`` every size is
divisible by N and the ``"row"`` shard layout (:mod:`workbench.core.shards`) needs no padding for
N ranks. Any ``dim`` that is a multiple of 8 therefore works up to 8 ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from workbench.core.checks import integer
from workbench.core.hf_config import load_hf_config
from workbench.core.hf_families import FAMILIES
from workbench.core.hf_fields import HFFields
from workbench.core.specs import ModelSpec

__all__ = ["LMConfig", "RMS_NORM_EPS", "init_lm_params", "lm_config_from_hf", "lm_param_shapes", "num_params"]

#: Epsilon added to the mean square in every RMSNorm.
RMS_NORM_EPS = 1e-5

#: Standard deviation of the token and position embeddings and of the LM head (GPT-2).
EMBED_STD = 0.02


@dataclass(frozen=True, kw_only=True)
class LMConfig:
    """Shape of the language model.

    Attributes:
        vocab_size: Number of token ids (tokens are ints in ``[0, vocab_size)``).
        seq_len: Longest input (tokens); rows of the position embedding.
        dim: Model width (elements per token).
        num_layers: Number of transformer blocks.
        num_heads: Attention heads per block; must divide ``dim``.
        mlp_dim: Hidden width of the MLP (elements).
        tie_embeddings: Whether the head reuses ``embed.weight`` (then there is no ``head.weight``).

    Raises:
        ValueError: on an invalid field; the message names the field.
    """

    vocab_size: int
    seq_len: int
    dim: int
    num_layers: int
    num_heads: int
    mlp_dim: int
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        for name in ("vocab_size", "seq_len", "dim", "num_layers", "num_heads", "mlp_dim"):
            object.__setattr__(self, name, integer(f"LMConfig.{name}", getattr(self, name), low=1))
        if not isinstance(self.tie_embeddings, bool):
            raise ValueError(f"LMConfig.tie_embeddings must be a bool, got {self.tie_embeddings!r}.")
        if self.dim % self.num_heads:
            raise ValueError(f"LMConfig.num_heads ({self.num_heads}) must divide dim ({self.dim}).")

    @property
    def head_dim(self) -> int:
        """Elements per attention head: ``dim // num_heads``."""
        return self.dim // self.num_heads


def lm_config_from_hf(config, seq_len: int) -> LMConfig:
    """The workbench's own LM with a Hugging Face config's shape: its width, depth, heads, MLP width, vocabulary
    and tied head, at ``seq_len`` positions.

    What the LM cannot take from the config it leaves, as the issue allows the JAX side of a config's runs
    (MLX trains the config's own classes, :mod:`workbench.models.mlx_lm_config`): every head has its own K and V
    (``num_key_value_heads`` is not read), the MLP is one GELU matrix pair (not a gated three), and positions are
    learned (no RoPE). Activations per token (T x T scores per head, the D- and F-wide hidden states) are the
    config's.

    Args:
        config: A ``config.json`` path, a folder holding one, or its dict (read by
            :func:`~workbench.core.hf_config.load_hf_config`).
        seq_len: Positions of the learned position embedding (the run's sequence length).

    Raises:
        ValueError: naming the field and the file, where ``hidden_size``, ``num_hidden_layers``,
            ``num_attention_heads``, ``intermediate_size`` or ``vocab_size`` is absent or not a positive integer,
            ``tie_word_embeddings`` is not a boolean (absent: the config class's default for its ``model_type``),
            ``num_attention_heads`` does not divide ``hidden_size``, or a ``head_dim`` given makes the heads other
            than ``hidden_size`` wide.
    """
    raw, where = load_hf_config(config)
    f = HFFields(raw, where)
    family = FAMILIES.get(raw.get("model_type")) if isinstance(raw.get("model_type"), str) else None
    dim, heads = f.count("hidden_size"), f.count("num_attention_heads")
    if "head_dim" not in raw and dim % heads:
        raise f.error("num_attention_heads", f"= {heads} does not divide hidden_size = {dim}: the workbench LM's "
                                             "heads split its width.")
    head_dim = f.count("head_dim", dim // heads)
    if head_dim * heads != dim:
        raise f.error("head_dim", f"= {head_dim} makes {heads} heads {head_dim * heads} wide, not hidden_size = "
                                  f"{dim}: the workbench LM's heads split its width.")
    return LMConfig(vocab_size=f.count("vocab_size"), seq_len=seq_len, dim=dim, num_layers=f.count("num_hidden_layers"),
                    num_heads=heads, mlp_dim=f.count("intermediate_size"),
                    tie_embeddings=f.flag("tie_word_embeddings", family.tie_default if family else False))


def lm_param_shapes(config: LMConfig) -> dict[str, tuple[int, ...]]:
    """Parameter paths and shapes, in the model's fixed order (the MLX ``tree_flatten`` order).

    Args:
        config: The model shape.

    Returns:
        ``{path: shape}``: ``embed.weight`` (V, D), ``pos_embed.weight`` (T, D), per layer ``i``
        ``layers.{i}.attn_norm.weight`` (D,), ``layers.{i}.attn.{wq,wk,wv,wo}.weight`` (D, D),
        ``layers.{i}.mlp_norm.weight`` (D,), ``layers.{i}.mlp.w_in.weight`` (F, D),
        ``layers.{i}.mlp.w_out.weight`` (D, F), then ``norm.weight`` (D,) and, unless tied,
        ``head.weight`` (V, D).
    """
    v, t, d, f = config.vocab_size, config.seq_len, config.dim, config.mlp_dim
    shapes: dict[str, tuple[int, ...]] = {"embed.weight": (v, d), "pos_embed.weight": (t, d)}
    for i in range(config.num_layers):
        p = f"layers.{i}."
        shapes[p + "attn_norm.weight"] = (d,)
        for name in ("wq", "wk", "wv", "wo"):
            shapes[f"{p}attn.{name}.weight"] = (d, d)
        shapes[p + "mlp_norm.weight"] = (d,)
        shapes[p + "mlp.w_in.weight"] = (f, d)
        shapes[p + "mlp.w_out.weight"] = (d, f)
    shapes["norm.weight"] = (d,)
    if not config.tie_embeddings:
        shapes["head.weight"] = (v, d)
    return shapes


def lm_model_spec(config: LMConfig, dtype: str = "float32") -> ModelSpec:
    """The LM's parameters as a :class:`~workbench.core.specs.ModelSpec` named ``"lm"``, every array in ``dtype``."""
    return ModelSpec.from_shapes(dict(lm_param_shapes(config)), name="lm", dtype=dtype)


def num_params(config: LMConfig) -> int:
    """Total number of parameters (elements), counting a tied embedding once."""
    return sum(math.prod(shape) for shape in lm_param_shapes(config).values())


def _init_std(config: LMConfig, path: str, shape: tuple[int, ...]) -> float:
    """Standard deviation of a matrix: 0.02 for embeddings and head; ``1/sqrt(fan_in)`` for
    hidden matrices, times ``1/sqrt(2 * num_layers)`` for the residual outputs (``wo``,
    ``w_out``), as GPT-2 (Radford et al. 2019, section 2.3) scales them."""
    if path.startswith(("embed.", "pos_embed.", "head.")):
        return EMBED_STD
    std = 1.0 / math.sqrt(shape[1])
    if path.endswith(("attn.wo.weight", "mlp.w_out.weight")):
        std /= math.sqrt(2 * config.num_layers)
    return std


def init_lm_params(config: LMConfig, seed: int) -> dict[str, np.ndarray]:
    """Seeded float32 weights, drawn in the order of :func:`lm_param_shapes`.

    Norm weights are ones; matrices are ``N(0, std**2)`` with ``std`` from the rule above.

    Args:
        config: The model shape.
        seed: Seed of ``numpy.random.default_rng``; the same seed gives the same weights.

    Returns:
        ``{path: float32 array}`` in the fixed order of :func:`lm_param_shapes`.
    """
    rng = np.random.default_rng(seed)
    params = {}
    for path, shape in lm_param_shapes(config).items():
        if len(shape) == 1:
            params[path] = np.ones(shape, np.float32)
        else:
            std = _init_std(config, path, shape)
            params[path] = (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)
    return params

"""A third-party model from its config: mlx-lm's own classes, built from a ``config.json`` (no weights), to train.

"Your config" trains for real, not only planned: :func:`mlx_lm_factory` builds the model class ``mlx_lm``
loads for the config's ``model_type`` (``mlx_lm.models.<type>.Model`` from its ``ModelArgs.from_dict``, with
``mlx_lm.utils.MODEL_REMAPPING``, so ``mistral`` is its Llama and ``kimi_k2`` its DeepSeek-V3), with freshly
drawn weights (MLX's initialisers, seeded), and returns ``(model, loss_fn)``: the factory contract of
:class:`~workbench.runs.spec.RunSpec` (``model_factory="package.module:function"``). A run names a function
of the user's own module, which passes its config::

    # my_model.py (beside the notebook)
    from workbench.models.mlx_lm_config import mlx_lm_factory

    CONFIG = {"model_type": "qwen3", "hidden_size": 128, ...}   # or the path of a config.json

    def factory(seed: int = 0):
        return mlx_lm_factory(CONFIG, seed=seed)

    RunSpec(model_factory="my_model:factory", model=dict(vocab_size=..., seq_len=...), data="tokens.bin")

The run's id hashes the factory module's source: a config written in that module is part of it; a
``config.json`` it reads is not (edit the module, or name a new file, when the config changes).

The parameters are float32, as ``mlx_lm``'s classes create them (``RunSpec.precision="bfloat16"`` casts
them, as for any factory). Needs the ``mlx-lm`` extra (``pip install -e ".[mlx-lm]"``).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Mapping
from typing import Any, Callable

from workbench.core.checks import shown
from workbench.core.hf_config import load_hf_config

__all__ = ["build_mlx_lm", "mlx_lm_class_name", "mlx_lm_factory", "mlx_lm_loss"]


def _mlx_lm_module(raw: Mapping[str, Any], where: str):
    """The ``mlx_lm.models`` module for the config's ``model_type``, remapped as ``mlx_lm`` remaps it."""
    try:
        from mlx_lm.utils import MODEL_REMAPPING
    except ImportError as err:
        raise ImportError("building an mlx-lm model needs the mlx-lm package: pip install -e \".[mlx-lm]\"") from err
    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or not model_type.isidentifier():
        raise ValueError(f"{where}: field 'model_type' must name an mlx-lm architecture such as \"llama\", "
                         f"got {shown(model_type)}.")
    name = MODEL_REMAPPING.get(model_type, model_type)
    try:
        return importlib.import_module(f"mlx_lm.models.{name}")
    except ImportError:
        raise ValueError(f"{where}: field 'model_type' = {model_type!r} is not an architecture of the installed "
                         f"mlx-lm (no mlx_lm.models.{name}).") from None


def mlx_lm_class_name(config: str | os.PathLike | Mapping[str, Any]) -> str:
    """``"mlx_lm.models.<type>.Model"``: the class :func:`build_mlx_lm` builds for ``config`` (after remapping)."""
    raw, where = load_hf_config(config)
    return f"{_mlx_lm_module(raw, where).__name__}.Model"


def build_mlx_lm(config: str | os.PathLike | Mapping[str, Any], *, seed: int = 0):
    """mlx-lm's model for ``config``, with new weights: nothing is downloaded or read but the config.

    Args:
        config: A ``config.json`` path, a folder holding one, or the dict it holds (read by
            :func:`~workbench.core.hf_config.load_hf_config`: bounded, errors name the file).
        seed: Seeds ``mlx.core.random`` before the weights are drawn (the same seed, the same weights).

    Returns:
        The ``mlx.nn.Module`` (``mlx_lm.models.<type>.Model``), float32, evaluated.

    Raises:
        ValueError: naming the file and the field: an architecture mlx-lm does not have, a field its
            ``ModelArgs`` requires and the config lacks, or a value it refuses.
        ImportError: mlx-lm is not installed (the extra to install is named).
    """
    import mlx.core as mx

    raw, where = load_hf_config(config)
    module = _mlx_lm_module(raw, where)
    required = [f.name for f in dataclasses.fields(module.ModelArgs)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [name for name in required if raw.get(name) is None]
    if missing:
        raise ValueError(f"{where}: field '{missing[0]}' is required by {module.__name__}.ModelArgs and absent "
                         f"(or null); it requires {', '.join(required)}.")
    mx.random.seed(int(seed) % 2**64)
    try:
        model = module.Model(module.ModelArgs.from_dict(raw))
    except Exception as err:  # mlx-lm's own checks (a ValueError, an assert, a shape it cannot build)
        raise ValueError(f"{where}: {module.__name__} cannot build this config ({type(err).__name__}: {err}).") \
            from None
    mx.eval(model.parameters())
    return model


def mlx_lm_loss(model, inputs, targets):
    """Mean next-token cross-entropy in fp32 (nats per token) of an mlx-lm model.

    Args:
        model: An mlx-lm ``Model``: ``model(inputs)`` gives ``(B, T, vocab)`` logits.
        inputs: ``(B, T)`` int tokens.
        targets: ``(B, T)`` int tokens, the token after each input position.

    Returns:
        A float32 scalar.
    """
    import mlx.core as mx
    import mlx.nn as nn

    logits = model(inputs).astype(mx.float32)
    return nn.losses.cross_entropy(logits, targets, reduction="mean")


def mlx_lm_factory(config: str | os.PathLike | Mapping[str, Any], *, seed: int = 0) -> tuple[Any, Callable]:
    """``(model, loss_fn)`` for :class:`~workbench.runs.spec.RunSpec`'s ``model_factory``: :func:`build_mlx_lm`
    and :func:`mlx_lm_loss`. Call it from a factory of your own module (see the module docstring)."""
    return build_mlx_lm(config, seed=seed), mlx_lm_loss

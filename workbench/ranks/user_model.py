"""The model and data of a run, built-in or the user's, as the ranks and the driver use them.

A run's model is the built-in LM (``spec.model`` is its config) or what the factory
``spec.model_factory`` returns (:class:`~workbench.runs.spec.RunSpec`):

* MLX: ``(nn.Module, loss_fn(model, inputs, targets) -> scalar)``;
* JAX: ``(nnx.Module, loss_fn(params, (inputs, targets)) -> scalar)`` where ``params`` is the flat
  ``{dotted path: array}`` dict of the module's ``nnx.Param`` variables (:func:`nnx_flat_params`).

A factory that takes a ``seed`` argument is called with ``seed=spec.init_seed``, so every rank builds
the same weights. :func:`check_user_run` runs in the driver before any engine starts: it builds the
model once, checks what the factory returned, that every FSDP layout can shard it, and that every token
of the data file is below the model's vocabulary, and returns the model's
:class:`~workbench.core.specs.ModelSpec` for the memory estimate.
"""

from __future__ import annotations

import inspect
import os
from typing import Any, Callable

import numpy as np

from workbench.core.buckets import plan_buckets
from workbench.core.shards import plan_shards
from workbench.core.specs import ModelSpec, spec_from_flat
from workbench.runs.factory import add_import_paths, resolve_factory

EXPECTED = {"mlx": "(mlx.nn.Module, loss_fn(model, inputs, targets))",
            "jax": "(flax.nnx.Module, loss_fn(params, (inputs, targets)))"}


def use_driver_paths(paths: list[str]) -> None:
    """On an engine: import the user's modules from the driver's folders (its working directory first,
    then the repository root), and read relative data paths from its working directory."""
    add_import_paths(list(paths))
    if paths and os.path.isdir(paths[0]):
        os.chdir(paths[0])


def call_factory(spec) -> tuple[Any, Callable]:
    """``spec.model_factory``'s ``(model, loss_fn)``, checked against the framework's contract.

    Raises:
        ValueError: naming the factory and what was expected, if it raises or returns anything else.
    """
    fn, _ = resolve_factory("model_factory", spec.model_factory)
    where = f"RunSpec.model_factory={spec.model_factory!r}"
    try:
        takes_seed = "seed" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        takes_seed = False
    try:
        out = fn(seed=spec.init_seed) if takes_seed else fn()
    except Exception as err:  # the user's code
        raise ValueError(f"{where}: the factory raised {type(err).__name__}: {err}") from err
    if spec.framework == "mlx":
        import mlx.nn as nn
        module_type = nn.Module
    else:
        from flax import nnx
        module_type = nnx.Module
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], module_type) and callable(out[1])):
        got = f"a {len(out)}-tuple of {', '.join(type(x).__name__ for x in out)}" if isinstance(out, tuple) \
            else f"a {type(out).__name__}"
        raise ValueError(f"{where}: for framework={spec.framework!r} a factory returns {EXPECTED[spec.framework]}; "
                         f"it returned {got}")
    return out


def nnx_flat_params(model) -> dict[str, Any]:
    """An NNX module's ``nnx.Param`` arrays as ``{dotted path: array}``, in flax's sorted path order."""
    from flax import nnx

    return {".".join(str(k) for k in path): var.value for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def mlx_model_and_loss(spec) -> tuple[Any, Callable]:
    """The run's MLX model, in ``spec.precision``, and its ``loss_fn(model, inputs, targets)``."""
    import mlx.core as mx

    if spec.model_factory is not None:
        model, loss_fn = call_factory(spec)
    else:
        from workbench.models.init import init_lm_params
        from workbench.models.mlx_lm import MLXLM, lm_loss, load_params

        model, loss_fn = MLXLM(spec.config), lm_loss
        load_params(model, init_lm_params(spec.config, spec.init_seed))
    if spec.precision == "bfloat16":
        model.set_dtype(mx.bfloat16)
    return model, loss_fn


def jax_params_and_loss(spec) -> tuple[dict[str, np.ndarray], Callable]:
    """The run's JAX parameters (flat ``{dotted path: array}``, in ``spec.precision``) and ``loss_fn(params, batch)``."""
    if spec.model_factory is not None:
        model, loss_fn = call_factory(spec)
        params = {k: np.asarray(v) for k, v in nnx_flat_params(model).items()}
    else:
        from workbench.models.init import init_lm_params
        from workbench.models.jax_lm import make_loss_fn

        params, loss_fn = init_lm_params(spec.config, spec.init_seed), make_loss_fn(spec.config)
    if spec.precision == "bfloat16":
        import jax.numpy as jnp

        params = {k: np.asarray(v).astype(jnp.bfloat16) for k, v in params.items()}
    return params, loss_fn


def user_units(params: dict, loss_fn: Callable) -> tuple[list[Callable], Callable, list[list[str]]]:
    """A user's JAX model as a ZeRO-3 chain of one unit (the whole model: the workbench cannot split a
    loss function into layers), in the form of :func:`workbench.ranks.train_jax.lm_units`."""
    return [lambda p, batch: loss_fn(p, batch)], (lambda loss, batch: loss), [list(params)]


def global_batches(spec) -> Callable[[int], np.ndarray]:
    """``batch_for_step(step)``: step's global batch, ``(global_batch, seq_len + 1)`` int32 tokens, from the
    Markov chain or ``spec.data``; the same in every process and for every strategy."""
    seq_len = spec.model["seq_len"]
    if spec.data is not None:
        from workbench.models.tokens import load_token_file, sample_batch

        tokens = load_token_file(spec.data, dtype=spec.data_dtype)
        return lambda step: sample_batch(tokens, step, spec.global_batch, seq_len, seed=spec.data_seed)
    from workbench.models.data import make_markov_chain, sample_batch as sample_markov

    chain = make_markov_chain(spec.model["vocab_size"], seed=spec.data_seed, concentration=spec.concentration)
    return lambda step: sample_markov(chain, step, spec.global_batch, seq_len, seed=spec.data_seed)


def user_model_spec(spec) -> ModelSpec:
    """The parameters of ``spec``'s user model (built once, here) in ``spec.precision``: MLX's
    ``trainable_parameters`` (``spec_from_mlx``) or the NNX module's ``nnx.Param`` (``spec_from_nnx``)."""
    model, _ = call_factory(spec)
    if spec.framework == "mlx":
        from workbench.adapters.mlx.base import spec_from_mlx

        found = spec_from_mlx(model)
    else:
        from workbench.adapters.jax.base import spec_from_nnx

        found = spec_from_nnx(model)
    return spec_from_flat([(p.path, p.shape, spec.precision) for p in found.params], found.name)


def check_user_run(spec) -> ModelSpec | None:
    """Before any engine starts: the user model's spec (None for the built-in LM), its shards, and the data.

    Raises:
        ValueError: the factory's return (named), ``RunSpec.strategy`` when a layout cannot tile one of
            the model's arrays over ``num_ranks``, or ``RunSpec.data`` when a token is ``>= vocab_size``.
    """
    model = user_model_spec(spec) if spec.model_factory is not None else None
    if model is not None and spec.strategy != "ddp":
        try:
            plan_shards(plan_buckets(model, spec.communication_size), spec.num_ranks,
                        "flat" if spec.strategy == "fsdp-flat" else "row")
        except ValueError as err:
            raise ValueError(f"RunSpec.strategy={spec.strategy!r}: {err}") from None
    if spec.data is not None:
        from workbench.models.tokens import load_token_file

        try:
            load_token_file(spec.data, dtype=spec.data_dtype, vocab_size=spec.model["vocab_size"])
        except ValueError as err:
            raise ValueError(f"RunSpec.data={spec.data!r}: {err} (model['vocab_size'] is the model's vocabulary)") \
                from None
    return model

"""The model and data of a run, built-in or the user's, as the ranks and the driver use them.

A run's model is the built-in LM (``spec.model`` is its config) or what the factory
``spec.model_factory`` returns (:class:`~workbench.runs.spec.RunSpec`):

* MLX: ``(nn.Module, loss_fn(model, inputs, targets) -> scalar)``;
* JAX: ``(nnx.Module, loss_fn(params, (inputs, targets)) -> scalar)`` where ``params`` is the flat
  ``{dotted path: array}`` dict of the module's ``nnx.Param`` variables (:func:`nnx_flat_params`).

A factory that takes a ``seed`` argument is called with ``seed=spec.init_seed``, after the global
generators are seeded with it (:func:`seed_generators`), and the ranks compare a digest of the weights
they start from (:func:`start_fingerprint`, :func:`agree_on_start`). :func:`check_user_run` runs before
any engine starts: the data file against the vocabulary, what the factory returned and its vocabulary
(:func:`check_model_vocab`), and that every FSDP layout can shard it; it returns the model's
:class:`~workbench.core.specs.ModelSpec` for the memory estimate. On the engines every batch is checked
(:func:`global_batches`) and every loss must be finite (:func:`check_finite_loss`).
"""

from __future__ import annotations

import inspect
import math
import os
import random
import sys
from typing import Any, Callable

import numpy as np

from workbench.core.fingerprint import ANOTHER_LAUNCH, LAUNCH_ENV, RanksDisagree, plan_fingerprint, weights_digest
from workbench.core.fully_shard_plan import block_paths
from workbench.core.specs import ModelSpec, spec_from_flat
from workbench.ranks.model_vocab import check_model_vocab
from workbench.runs.factory import add_import_paths, data_sha256, resolve_factory
from workbench.strategies import get_strategy

EXPECTED = {"mlx": "(mlx.nn.Module, loss_fn(model, inputs, targets))",
            "jax": "(flax.nnx.Module, loss_fn(params, (inputs, targets)))"}


def use_driver_paths(paths: list[str]) -> None:
    """On an engine: import the user's modules from the driver's folders (its working directory first,
    then the repository root), and read relative data paths from its working directory."""
    add_import_paths(list(paths))
    if paths and os.path.isdir(paths[0]):
        os.chdir(paths[0])


def seed_generators(seed: int, framework: str) -> None:
    """Seed every global generator a factory may draw from: Python's ``random``, ``numpy.random``, and
    ``mlx.core.random`` (MLX seeds each process differently) or, if already imported, ``torch``. JAX has no
    global generator (an ``nnx.Rngs`` is made with its seed by the factory itself)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    if framework == "mlx":
        import mlx.core as mx

        mx.random.seed(seed % 2**64)
    if "torch" in sys.modules:
        sys.modules["torch"].manual_seed(seed)


def call_factory(spec) -> tuple[Any, Callable]:
    """``spec.model_factory``'s ``(model, loss_fn)``, checked against the framework's contract.

    The global generators are seeded from ``spec.init_seed`` first (:func:`seed_generators`).

    Raises:
        ValueError: naming the factory and what was expected, if it raises or returns anything else.
    """
    fn, _ = resolve_factory("model_factory", spec.model_factory)
    where = f"RunSpec.model_factory={spec.model_factory!r}"
    try:
        takes_seed = "seed" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        takes_seed = False
    seed_generators(spec.init_seed, spec.framework)
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


def block_units(model) -> list[str]:
    """The MLX module paths of ``model``'s transformer blocks, by the plan's rule
    (:func:`~workbench.core.fully_shard_plan.block_paths`: the shallowest ``layers``, ``blocks`` or ``h`` entry of
    each parameter path), e.g. ``["model.layers.0", "model.layers.1"]`` for an mlx-lm model; ``[]`` when it has
    none (the whole model is then one unit).

    A fully sharded (ZeRO-3) run gathers one unit at a time, so a model wrapped whole gathers all its weights at
    once: these are the units :mod:`workbench.ranks.train_mlx` gives
    :func:`~workbench.adapters.mlx.zero3.shard_model` (whose own default finds only a top-level ``layers``), and
    the units the run's plan counts collectives and memory by. The root unit holds what no block holds.
    """
    from mlx.utils import tree_flatten

    return block_paths(path for path, _ in tree_flatten(model.parameters()))


def user_units(params: dict, loss_fn: Callable) -> tuple[list[Callable], Callable, list[list[str]]]:
    """A user's JAX model as a ZeRO-3 chain of one unit (the whole model: the workbench cannot split a
    loss function into layers), in the form of :func:`workbench.ranks.train_jax.lm_units`."""
    return [lambda p, batch: loss_fn(p, batch)], (lambda loss, batch: loss), [list(params)]


def global_batches(spec) -> Callable[[int], np.ndarray]:
    """``batch_for_step(step)``: step's global batch, ``(global_batch, seq_len + 1)`` int32 tokens, from the
    Markov chain or ``spec.data``; the same in every process and for every strategy.

    A token file is checked before every batch: its size and modification time (one ``stat``: a file cut
    or rewritten during the run), then the batch's tokens against ``model['vocab_size']``.

    Raises:
        ValueError: naming the file and the step, if it changed since this rank opened it or a token of
            the batch is out of the vocabulary.
    """
    seq_len, vocab_size = spec.model["seq_len"], spec.model["vocab_size"]
    if spec.data is None:
        from workbench.models.data import make_markov_chain, sample_batch as sample_markov

        chain = make_markov_chain(vocab_size, seed=spec.data_seed, concentration=spec.concentration)
        return lambda step: sample_markov(chain, step, spec.global_batch, seq_len, seed=spec.data_seed)
    from workbench.models.tokens import check_batch_tokens, load_token_file, sample_batch

    opened = os.stat(spec.data)  # before the map: a change after the engine's digest check is seen too
    tokens = load_token_file(spec.data, dtype=spec.data_dtype)

    def check_unchanged(step: int) -> None:
        nonlocal opened
        now = os.stat(spec.data)
        if (now.st_size, now.st_mtime_ns) != (opened.st_size, opened.st_mtime_ns):
            # Touched, or the same bytes copied back: the same data, by its digest, trains on.
            if now.st_size != opened.st_size or spec.data_sha256 is None or data_sha256(spec.data) != spec.data_sha256:
                raise ValueError(f"RunSpec.data={spec.data!r}: the token file changed during the run, before step "
                                 f"{step} ({opened.st_size} bytes when opened, {now.st_size} now, other bytes): "
                                 "stopped rather than train on other data")
            opened = now

    def batch_for_step(step: int) -> np.ndarray:
        check_unchanged(step)
        batch = sample_batch(tokens, step, spec.global_batch, seq_len, seed=spec.data_seed)
        try:
            check_batch_tokens(batch, vocab_size, where=f"RunSpec.data={spec.data!r}", step=step)
        except ValueError:
            check_unchanged(step)  # rewritten between the stat and the read: say so, not only the stray token
            raise
        return batch

    return batch_for_step


def user_model_spec(spec) -> ModelSpec:
    """The parameters of ``spec``'s user model (built once, here) in ``spec.precision``: MLX's
    ``trainable_parameters`` (``spec_from_mlx``) or the NNX module's ``nnx.Param`` (``spec_from_nnx``).

    Raises:
        ValueError: the factory's return (named), or its vocabulary (:func:`check_model_vocab`).
    """
    model, _ = call_factory(spec)
    if spec.framework == "mlx":
        from workbench.adapters.mlx.base import spec_from_mlx

        found = spec_from_mlx(model)
    else:
        from workbench.adapters.jax.base import spec_from_nnx

        found = spec_from_nnx(model)
    check_model_vocab(spec, model, [(p.path, p.shape) for p in found.params])
    return spec_from_flat([(p.path, p.shape, spec.precision) for p in found.params], found.name)


def start_fingerprint(spec, params: list[tuple[str, Any]], group_size: int,
                      to_numpy: Callable[[Any], np.ndarray] = np.asarray) -> dict[str, Any]:
    """What the ranks compare before the first step: first ``launch``, the value every rank of one launch was given
    (:data:`~workbench.core.fingerprint.LAUNCH_ENV`; None outside a launch plan), then the plan (paths, shapes,
    dtypes, strategy and settings) and ``initial_weights``, a digest of the starting weights (``to_numpy`` turns one
    array into NumPy)."""
    plan = plan_fingerprint(params, group_size=group_size, strategy=spec.strategy,
                            communication_size=spec.communication_size, clipping=spec.max_norm is not None,
                            num_microbatches=spec.num_microbatches, defer_sync=spec.defer_sync)
    fingerprint = {"launch": os.environ.get(LAUNCH_ENV), **plan}
    fingerprint["initial_weights"] = weights_digest((path, to_numpy(a)) for path, a in params)
    return fingerprint


def agree_on_start(exchange: Callable[[dict], float], fingerprint: dict, spec, rank: int) -> float:
    """``exchange(fingerprint)`` (the framework's all-gather; its seconds), saying what differing weights mean.

    Raises:
        RanksDisagree: the plans differ (naming the field).
        RuntimeError: ranks of two launches joined one rendezvous (:data:`~workbench.core.fingerprint.ANOTHER_LAUNCH`).
        ValueError: on every rank, naming the ranks and the factory, when the starting weights differ.
    """
    try:
        return exchange(fingerprint)
    except RanksDisagree as err:
        if err.field == "launch":
            raise RuntimeError(f"rank {rank}: {ANOTHER_LAUNCH} (ranks {err.ranks} were started by another launch "
                               "that drew the same rendezvous port): this launch is tried again on fresh ports") from None
        if err.field != "initial_weights":
            raise
        who = f"the model factory {spec.model_factory!r}" if spec.model_factory else "the built-in LM"
        generators = "Python's random, numpy.random" + (" and mlx.core.random" if spec.framework == "mlx" else "")
        raise ValueError(f"ranks {err.ranks} start from other weights than rank 0 (this is rank {rank}): {who} "
                         f"built different weights on them, although every rank seeded {generators} with "
                         f"init_seed={spec.init_seed} before calling it. It draws from a generator the workbench "
                         "cannot seed (os.urandom, the time, numpy.random.default_rng() or a JAX key without a "
                         "seed?): make its weights from its seed argument.") from None


def check_finite_loss(loss: float, step: int, rank: int) -> None:
    """Raises ``FloatingPointError`` naming the step and the rank when ``loss`` is NaN or infinite."""
    if not math.isfinite(loss):
        raise FloatingPointError(f"rank {rank}: the loss of step {step} is {loss}, not finite (diverged, or a "
                                 "batch the model cannot take): the run stops here rather than train on NaN")


def check_user_run(spec, build: Callable[[Any], ModelSpec] | None = None) -> ModelSpec | None:
    """Before any engine starts: the data, then the user model's spec (None for the built-in LM) and its shards.

    Args:
        spec: The run.
        build: Builds the user model's spec (the driver's runs it in a bounded subprocess); default
            :func:`user_model_spec`, here.

    Raises:
        ValueError: ``RunSpec.data_sha256`` when the token file changed since the spec was made,
            ``RunSpec.data`` when a token is ``>= vocab_size`` or its dtype is wrong, the factory's return
            or vocabulary (named), or ``RunSpec.strategy`` when a layout cannot tile one of the model's
            arrays over ``num_ranks``.
    """
    if spec.data is not None:
        from workbench.models.tokens import load_token_file

        spec.check_data_unchanged()
        try:
            load_token_file(spec.data, dtype=spec.data_dtype, vocab_size=spec.model["vocab_size"])
        except ValueError as err:
            raise ValueError(f"RunSpec.data={spec.data!r}: {err} (model['vocab_size'] is the model's vocabulary)") \
                from None
    if spec.model_factory is None:
        return None
    model = (build or user_model_spec)(spec)
    try:  # before any engine starts: the strategy's shards must tile the user's model
        get_strategy(spec.strategy).check_model(model, spec.shard_group_size, spec.communication_size)
    except ValueError as err:
        raise ValueError(f"RunSpec.strategy={spec.strategy!r}: {err}") from None
    return model

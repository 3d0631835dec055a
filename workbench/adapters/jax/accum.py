"""Gradient accumulation for the JAX steps: G micro-batches per optimizer step, synced every micro-batch or once.

The semantics are those of :mod:`workbench.adapters.mlx.accum`. Each device's local batch
is split along axis 0 into G equal, consecutive micro-batches. Per-micro-batch sync
issues the gradient collectives after every micro-batch (DDP: G all-reduces per array;
FSDP: G reduce-scatters per bucket, accumulating this rank's 1/N shards; ZeRO-3: every
unit gathered and reduce-scattered per micro-batch, accumulating 1/N rows). Deferred sync
(NeMo Automodel's ``prepare_for_grad_accumulation`` / ``prepare_for_final_backward``)
accumulates full local gradients and issues them once, after the final micro-batch
(ZeRO-3: every unit gathered once and kept for all G micro-batches). Both equal the step
of one large batch: with equal micro-batches and mean losses the gradient is
``sum / (G * N)``, and the loss metric is the mean over micro-batches (and ranks).

Memory: deferral keeps an unsharded gradient accumulator (FSDP, ZeRO-3) and, under ZeRO-3,
every unit's gathered weights for the whole step; the per-micro-batch accumulator is 1/N.
DDP's is full in both modes. Accumulation is in the gradient's dtype.

Program construction: the micro-batch loop is an unrolled Python loop inside the jitted
``shard_map`` body, so each collective issued per micro-batch is its own op in the lowered
program, and ``num_collectives`` can be checked against the program text. A ``lax.scan``
would show its body's collectives once whatever G. The price: trace and compile time
grow with G. Counts are of the *lowered* program (JAX's StableHLO): on CPU, XLA's
all-reduce combiner later merges independent all-reduces into one variadic op, so the
compiled program can show fewer all-reduces than were asked for.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from workbench.core.checks import integer
from workbench.strategies import COLLECTIVE_KINDS

KINDS = COLLECTIVE_KINDS  # (workbench.strategies)


def check_accum(num_microbatches: int, defer_sync: bool) -> None:
    """Raise ``ValueError`` naming ``num_microbatches`` or ``defer_sync`` if it is invalid."""
    integer("num_microbatches", num_microbatches, low=1)
    if not isinstance(defer_sync, (bool, np.bool_)):
        raise ValueError(f"defer_sync must be True or False, got {defer_sync!r}.")


def check_batch(batch: Any, num_data: int, num_microbatches: int) -> None:
    """Every batch leaf's axis 0 must split over ``num_data`` ranks, then into G micro-batches.

    Raises:
        ValueError: naming the leaf (its ``jax.tree_util`` key path), its shape and the divisor.
    """
    g = num_microbatches
    for path, leaf in jax.tree_util.tree_flatten_with_path(batch)[0]:
        name, shape = jax.tree_util.keystr(path) or "batch", np.shape(leaf)
        if not np.ndim(leaf) or shape[0] % num_data:
            raise ValueError(f"Batch leaf {name} has shape {shape}: "
                             f"axis 0 must be divisible by the {num_data} data-parallel ranks.")
        if (shape[0] // num_data) % g:
            raise ValueError(f"Batch leaf {name} has shape {shape}: each of the {num_data} ranks' "
                             f"{shape[0] // num_data} rows must split into num_microbatches={g} equal micro-batches.")


def split_local(batch: Any, num_microbatches: int) -> list[Any]:
    """Inside the step: the local batch as G consecutive micro-batches along axis 0 (G=1: ``[batch]``, untouched)."""
    g = num_microbatches
    if g == 1:
        return [batch]
    return [jax.tree_util.tree_map(lambda a, k=k: a[k * (a.shape[0] // g):(k + 1) * (a.shape[0] // g)], batch)
            for k in range(g)]


def accumulate(value_and_grad: Callable[[Any], tuple[jax.Array, Any]], micro_batches: list[Any],
               sync: Callable[[Any], Any] | None = None) -> tuple[jax.Array, Any]:
    """Sum over micro-batches of ``sync(grads)`` (or of the local grads), unrolled.

    Args:
        value_and_grad: ``micro_batch -> (loss, grads)``.
        micro_batches: From :func:`split_local`.
        sync: Applied to each micro-batch's gradients (per-micro-batch sync), or None (deferred).

    Returns:
        ``(mean loss over the micro-batches, summed gradients)``; with one micro-batch exactly
        ``value_and_grad``'s outputs (after ``sync``), so G=1 adds no op to the program.
    """
    total, acc = None, None
    for micro in micro_batches:
        loss, grads = value_and_grad(micro)
        grads = sync(grads) if sync is not None else grads
        acc = grads if acc is None else jax.tree_util.tree_map(jnp.add, acc, grads)
        total = loss if total is None else total + loss
    return (total / len(micro_batches) if len(micro_batches) > 1 else total), acc


def counts(all_reduce: int = 0, reduce_scatter: int = 0, all_gather: int = 0) -> dict[str, int]:
    """A per-kind collective count, ``{"all_reduce", "reduce_scatter", "all_gather"}``."""
    return {"all_reduce": int(all_reduce), "reduce_scatter": int(reduce_scatter), "all_gather": int(all_gather)}


def program_counts(program_text: str) -> dict[str, int]:
    """Collectives in a lowered step's StableHLO text (``lowered.as_text()``), by kind, as :func:`counts`
    (an all-to-all counts as the reduce-scatter it implements in the FSDP step)."""
    found = {k: program_text.count(f'"stablehlo.{k}"') for k in KINDS}
    found["reduce_scatter"] += program_text.count('"stablehlo.all_to_all"')  # the all-to-all reduce-scatter
    return counts(**found)


_COMPILED_OP = re.compile(r"\b(all-reduce|reduce-scatter|all-gather|all-to-all)(?:-start)?\(")


def compiled_program_counts(hlo_text: str) -> dict[str, int]:
    """Collectives XLA kept in a compiled step (``lowered.compile().as_text()``), by kind, as :func:`counts`.

    What runs, not what the step asked for: XLA combines all-reduces into one variadic op (the
    loss mean's included) and merges repeated all-gathers of the same rows (ZeRO-3's backward
    re-gather, every micro-batch's gather), so these can be fewer than :func:`program_counts`.
    """
    found = {k: 0 for k in KINDS}
    for m in _COMPILED_OP.finditer(hlo_text):
        kind = m.group(1).replace("-", "_")
        found["reduce_scatter" if kind == "all_to_all" else kind] += 1  # the FSDP step's all-to-all reduce-scatter
    return counts(**found)

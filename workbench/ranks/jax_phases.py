"""The JAX FSDP and DDP steps cut into separately compiled parts, to see where the time goes.

One jitted program runs the whole step, so nothing inside it can be timed. Here each part is its own
program over the same mesh, built from the step's own pieces (its bucket views, its optimizer,
its collectives), and each is timed alone behind a barrier: slower than the real step (every part
writes its result out, and nothing overlaps), but it says which part costs what. Parts, in order:

* FSDP on resident buckets (:meth:`~workbench.adapters.jax.fsdp.FsdpStep.step_buckets`): ``gradient``
  (forward and backward of the model reading its parameters as views of the bucket buffers: the
  gradient buckets), ``reduce_scatter``, ``update`` (the optimizer on this rank's slice of each
  buffer), ``all_gather`` (the next step's buffers);
* FSDP on the pytree (:meth:`~workbench.adapters.jax.fsdp.FsdpStep.step`, ``resident=False``): ``gradient``
  (of the arrays), ``pack`` (the gradient buckets), ``reduce_scatter``, ``update`` (this rank's slice
  of the packed parameters, and the optimizer on it), ``all_gather``, ``unpack`` (the arrays);
* DDP: ``gradient``, ``all_reduce``, ``update`` (the full optimizer).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import jax
import optax
from jax.sharding import PartitionSpec as P

from workbench.adapters.jax.fsdp import DdpStep, FsdpStep
from workbench.adapters.jax.step_base import (
    bucket_views,
    pack_bucket,
    reduce_scatter_rows,
    smap,
    state_specs,
    vary,
)


def _per_device(tree: Any) -> Any:
    return jax.tree_util.tree_map(lambda a: a[None], tree)


def _local(tree: Any) -> Any:
    return jax.tree_util.tree_map(lambda a: a[0], tree)


def _gradient(loss_fn: Callable, axis: str, mesh) -> Callable:
    """Forward and backward on this device's rows: ``(params, batch) -> (N, ...)`` local gradients."""

    def gradient(params, batch):
        return _per_device(jax.grad(loss_fn)(vary(params, (axis,)), batch))

    return smap(gradient, mesh, (P(), P(axis)), P(axis), True)


def fsdp_parts(step: FsdpStep, mesh, resident: bool = True) -> dict[str, Callable]:
    """The parts of ``step`` (built with ``axis="fsdp"``, no replica axis), each ``(inputs) -> outputs``.

    Args:
        resident: The parts of :meth:`~FsdpStep.step_buckets` (parameters are bucket buffers), else
            of :meth:`~FsdpStep.step` (parameters are the pytree; adds ``pack`` and ``unpack``).
    """
    n, layout, buckets, axis = step.num_shards, step.layout, step.packed_buckets, step.axis
    dev = P(axis)
    specs = state_specs(step.optimizer, [jax.ShapeDtypeStruct((bk.chunk_elems,), bk.dtype) for bk in buckets], axis)

    def pack(grads):
        leaves = step.treedef.flatten_up_to(_local(grads))
        return [pack_bucket(bk, leaves, n, layout)[None] for bk in buckets]

    def reduce_scatter(packed):
        return [reduce_scatter_rows(b[0], axis, n, step.reduce_scatter) / n for b in packed]

    def update(shards, opt_state, params):
        slices = step.local_slices(params if resident else step.pack_params(params))
        updates, opt_state = step.optimizer.update(shards, opt_state, slices)
        return optax.apply_updates(slices, updates), opt_state

    def all_gather(new):
        return [jax.lax.all_gather(s, axis, tiled=True, to="invarying") for s in new]

    def unpack(full):
        return bucket_views(buckets, full, n, layout, step.treedef)

    def loss_of_buffers(buffers, batch):
        return step.loss_fn(bucket_views(buckets, buffers, n, layout, step.treedef), batch)

    parts = {"gradient": _gradient(loss_of_buffers if resident else step.loss_fn, axis, mesh)}
    if not resident:
        parts["pack"] = smap(pack, mesh, (dev,), dev, True)
    parts |= {"reduce_scatter": smap(reduce_scatter, mesh, (dev,), dev, True),
              "update": smap(update, mesh, (dev, specs, P()), (dev, specs), True),
              "all_gather": smap(all_gather, mesh, (dev,), P(), True)}
    if not resident:
        parts["unpack"] = smap(unpack, mesh, (P(),), P(), True)
    return parts


def ddp_parts(step: DdpStep, mesh) -> dict[str, Callable]:
    """The parts of the DDP ``step`` (``axis="fsdp"``)."""
    axis = step.axes[0]
    dev = P(axis)

    def all_reduce(grads):
        return jax.lax.pmean(_local(grads), axis)

    def update(grads, opt_state, params):
        updates, opt_state = step.optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return {"gradient": _gradient(step.loss_fn, axis, mesh),
            "all_reduce": smap(all_reduce, mesh, (dev,), P(), True),
            "update": jax.jit(update)}


def time_parts(parts: dict[str, Callable], params, opt_state, batch, barrier: Callable[[str], None]) -> dict[str, float]:
    """Run the parts once, in order, each behind ``barrier``; seconds per part (state is not kept).

    ``params``: what the step takes (the bucket buffers for resident FSDP parts, else the pytree)."""
    times = {}

    def timed(name, *args):
        barrier(name)
        t0 = time.perf_counter()
        out = jax.block_until_ready(parts[name](*args))
        times[name] = time.perf_counter() - t0
        return out

    value = timed("gradient", params, batch)
    if "reduce_scatter" in parts:
        value = timed("reduce_scatter", timed("pack", value) if "pack" in parts else value)
        new, _ = timed("update", value, opt_state, params)
        full = timed("all_gather", new)
        if "unpack" in parts:
            timed("unpack", full)
    else:
        timed("update", timed("all_reduce", value), opt_state, params)
    return times

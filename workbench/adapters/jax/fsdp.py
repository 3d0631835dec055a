"""JAX training steps that realise the core's bucket and shard plans: FSDP, HSDP, DDP.

* :func:`make_fsdp_step` -- MLX ``fsdp_apply_gradients`` in ``jax.shard_map``
  (parameters replicated, gradients and optimizer state sharded: ZeRO-2-like, PyTorch
  FSDP with ``reshard_after_forward=False``). Per bucket of
  ``plan_shards(plan_buckets(spec_from_jax(params), communication_size), N, layout)``:
  the gradient bucket in the plan's layout, one reduce-scatter (on CPU an all-to-all of the
  rows and a local sum, XLA's ``psum_scatter`` elsewhere), optional clipping by
  the global norm, the optax update on the local slice, one ``all_gather``.
  ``dp_axis`` adds HSDP: shards are also summed over the replica axis (MLX #3194).
  Its resident form (issue 30, :meth:`FsdpStep.step_buckets`) keeps the parameters in the
  buckets' buffers between steps and donates them with the optimizer state.
* :func:`make_ddp_step` -- the reference: gradients ``pmean``-ed, full update.

Both take ``num_microbatches`` (G) and ``defer_sync``: gradient accumulation over G
micro-batches per step, synchronised every micro-batch or once
(:mod:`workbench.adapters.jax.accum`).

ZeRO-3 (parameters sharded at rest too) lives in :mod:`workbench.adapters.jax.zero3`,
built on this module's bucket packing, checks and clipping.

Optimizers must be elementwise (SGD, momentum, Adam, AdamW, ...): FSDP hands optax one
flat 1-D slice per bucket, so per-array rules (masks by tree path, LAMB/LARS trust
ratios, ``optax.clip_by_global_norm``) would see the wrong arrays; use ``max_norm``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from workbench.adapters.jax.accum import accumulate, check_accum, counts, split_local
from workbench.adapters.jax.base import spec_from_jax
from workbench.adapters.jax.step_base import (
    StepBase,
    axis_names,
    bucket_views,
    check_mesh,
    clip_leaves,
    global_norm,
    pack_bucket,
    packed_buckets,
    planned_order,
    reduce_scatter_rows,
    resolve_reduce_scatter,
    smap,
    state_specs,
    vary,
)
from workbench.core.buckets import plan_buckets
from workbench.core.shards import plan_shards
from workbench.core.units import MiB


class FsdpStep(StepBase):
    """An FSDP (or HSDP) training step; build it with :func:`make_fsdp_step`.

    Two ways to run it, one program body. :meth:`step` takes and returns the parameter pytree (it
    packs the buckets on entry and reads the arrays out on exit, every call). The resident form keeps
    the parameters in the plan's bucket buffers for the whole run: :meth:`to_buckets` once,
    :meth:`step_buckets` every step (parameter buffers and optimizer state donated), :meth:`from_buckets`
    when the arrays are wanted. In it the model reads its parameters as slices of the buffers, the gradient
    is packed into the bucket's shape as the reduce-scatter's operand (XLA fuses the two), the optimizer
    updates this rank's 1/N slice of each buffer, and the all-gather writes the next step's buffer: the
    parameters are never concatenated, split or copied out between steps.

    Attributes:
        plan: The :class:`~workbench.core.shards.ShardPlan` this step realises.
        param_sharding, batch_sharding: Where to ``jax.device_put`` params (replicated)
            and batches (axis 0 over the data axes) so that every step reuses one compilation.
        num_shards: N, the size of the sharding axis.
        num_data: Data-parallel ranks (N, times the replica axis size under HSDP).
        num_collectives: Gradient-path collectives per step: a reduce-scatter and an
            all-gather per bucket, an all-reduce per bucket over ``dp_axis`` (HSDP),
            and one all-reduce of the norm when clipping; 0 on a single device. With
            per-micro-batch sync the reduce-scatters (and HSDP all-reduces) are G per bucket.
            Metric-only reductions (the loss mean, the norm when not clipping) are not counted.
        collective_counts: The same by kind: ``{"all_reduce", "reduce_scatter", "all_gather"}``.
    """

    def __init__(self, loss_fn, params, optimizer, mesh, *, axis, communication_size, layout, max_norm, dp_axis,
                 return_grad_shards, num_microbatches, defer_sync, reduce_scatter="auto", order=None):
        check_accum(num_microbatches, defer_sync)
        self.reduce_scatter = resolve_reduce_scatter(reduce_scatter, mesh)
        self.num_microbatches, self.defer_sync = int(num_microbatches), bool(defer_sync)
        if layout not in ("row", "flat"):
            raise ValueError(f"FSDP layout must be 'row' or 'flat', got {layout!r}.")
        check_mesh(mesh, axis_names(axis) + axis_names(dp_axis))
        self.mesh, self.axis, self.dp_axis, self.layout, self.max_norm = mesh, axis, dp_axis, layout, max_norm
        self.loss_fn, self.optimizer, self.return_grad_shards = loss_fn, optimizer, return_grad_shards
        self.num_shards = n = int(mesh.shape[axis])
        num_replicas = int(mesh.shape[dp_axis]) if dp_axis else 1
        self._dp = dp_axis if num_replicas > 1 else None  # a replica axis of size 1 needs no collective
        self.num_data = n * num_replicas
        self.spec = spec_from_jax(params, name="params")
        self.treedef = jax.tree_util.tree_structure(params)
        planned, leaf_of = planned_order(self.spec, order)
        self.plan = plan_shards(plan_buckets(planned, communication_size), n, layout)
        self.packed_buckets = packed_buckets(self.plan, leaf_of)
        plan, nb = self.plan, len(self.packed_buckets)
        k = self.num_syncs
        self.collective_counts = counts(
            all_reduce=(max_norm is not None and n > 1) + (k * nb if num_replicas > 1 else 0),
            reduce_scatter=k * plan.num_reduce_scatters if n > 1 else 0,
            all_gather=plan.num_all_gathers if n > 1 else 0)
        local = [jax.ShapeDtypeStruct((bk.chunk_elems,), bk.dtype) for bk in self.packed_buckets]
        specs = state_specs(optimizer, local, axis)
        data = P(axis_names(dp_axis) + (axis,))
        metrics = {"loss": P(), "grad_norm": P()} | ({"grad_shards": [P(axis)] * nb} if return_grad_shards else {})
        self.param_sharding, self.batch_sharding = NamedSharding(mesh, P()), NamedSharding(mesh, data)
        live = self.num_data > 1
        self._init = smap(lambda p: self.optimizer.init(self.local_slices(self.pack_params(p))), mesh, (P(),), specs, live)
        self._step = smap(self._tree_body, mesh, (P(), specs, data), (P(), specs, metrics), live)
        self._step_buckets = smap(self._bucket_body, mesh, (P(), specs, data), (P(), specs, metrics), live,
                                  donate=(0, 1))
        self._to_buckets = smap(self.pack_params, mesh, (P(),), P(), live)
        self._from_buckets = smap(self.param_views, mesh, (P(),), P(), live)

    def pack_params(self, params: Any) -> list[jax.Array]:
        """Inside the step's ``shard_map``: a parameter-shaped pytree packed into the plan's bucket buffers."""
        leaves = self.treedef.flatten_up_to(params)
        return [pack_bucket(bk, leaves, self.num_shards, self.layout) for bk in self.packed_buckets]

    def param_views(self, buffers: Sequence[jax.Array]) -> Any:
        """Inside the step's ``shard_map``: the parameter pytree as views of the bucket buffers."""
        return bucket_views(self.packed_buckets, buffers, self.num_shards, self.layout, self.treedef)

    def local_slices(self, buffers: Sequence[jax.Array]) -> list[jax.Array]:
        """Inside the step's ``shard_map``: this rank's c elements of every bucket buffer (N*c elements)."""
        r = jax.lax.axis_index(self.axis)
        return [jax.lax.dynamic_slice_in_dim(buf, r * bk.chunk_elems, bk.chunk_elems)
                for bk, buf in zip(self.packed_buckets, buffers)]

    def _reduce(self, grads: Sequence[jax.Array], divisor: int | None) -> list[jax.Array]:
        """Gradient buckets (N*c each) -> per bucket this rank's summed shard (divided by ``divisor``, if given)."""
        n, axis, dp, shards = self.num_shards, self.axis, self._dp, []
        for s in grads:
            s = reduce_scatter_rows(s, axis, n, self.reduce_scatter) if n > 1 else s
            s = jax.lax.psum(s, dp) if dp else s
            shards.append(s / divisor if divisor else s)
        return shards

    def _bucket_body(self, buffers, opt_state, batch):
        n, axis, dp, g = self.num_shards, self.axis, self._dp, self.num_microbatches
        data_axes = axis_names(dp) + ((axis,) if n > 1 else ())
        value_and_grad, varying = jax.value_and_grad(self.loss_fn), vary(self.param_views(buffers), data_axes)
        # The gradient of the views, packed into the bucket's shape inside the step (XLA writes it straight into
        # the reduce-scatter's operand); accumulated as arrays, so deferral keeps one unsharded gradient.
        if self.num_syncs > 1:  # reduce-scatter every micro-batch, accumulate this rank's shards
            loss, shards = accumulate(lambda micro: value_and_grad(varying, micro), split_local(batch, g),
                                      lambda grads: self._reduce(self.pack_params(grads), None))
            shards = [s / (self.num_data * g) for s in shards]
        else:  # G=1, or deferred: accumulate full local gradients, reduce-scatter once
            loss, grads = accumulate(lambda micro: value_and_grad(varying, micro), split_local(batch, g))
            shards = self._reduce(self.pack_params(grads), self.num_data * g)
        sq = global_norm(shards)
        norm = jnp.sqrt(jax.lax.psum(sq, axis) if n > 1 else sq)
        clipped = clip_leaves(shards, norm, self.max_norm)
        slices = self.local_slices(buffers)
        updates, opt_state = self.optimizer.update(clipped, opt_state, slices)
        new = optax.apply_updates(slices, updates)
        buffers = [jax.lax.all_gather(s, axis, tiled=True, to="invarying") if n > 1 else s for s in new]
        metrics = {"loss": jax.lax.pmean(loss, data_axes) if data_axes else loss, "grad_norm": norm}
        if self.return_grad_shards:
            metrics["grad_shards"] = shards
        return buffers, opt_state, metrics

    def _tree_body(self, params, opt_state, batch):
        buffers, opt_state, metrics = self._bucket_body(self.pack_params(params), opt_state, batch)
        return self.param_views(buffers), opt_state, metrics

    def to_buckets(self, params: Any) -> list[jax.Array]:
        """The parameters as the plan's bucket buffers, replicated: per bucket a 1-D array of N*c elements
        in the plan's layout (rank r's slice at [r*c, (r+1)*c); ``flat``: zero padding at the end)."""
        self._check_params(params)
        return self._to_buckets(params)

    def from_buckets(self, buffers: Sequence[jax.Array]) -> Any:
        """The parameter pytree (replicated) read out of :meth:`to_buckets`' buffers."""
        self._check_buckets(buffers)
        return self._from_buckets(list(buffers))

    def step_buckets(self, buffers: Sequence[jax.Array], opt_state: Any, batch: Any) -> tuple[list, Any, dict]:
        """One step on resident buffers: as :meth:`step`, with parameters and result as bucket buffers.

        ``buffers`` and ``opt_state`` are donated: XLA may write the outputs into them, and they are
        deleted; pass on the returned ones."""
        self._check_buckets(buffers)
        self._check_batch(batch)
        buffers, opt_state, metrics = self._step_buckets(list(buffers), opt_state, batch)
        return buffers, opt_state, {**metrics, "num_collectives": self.num_collectives}

    def lower_buckets(self, buffers: Sequence[jax.Array], opt_state: Any, batch: Any) -> jax.stages.Lowered:
        """The lowered resident step (:meth:`step_buckets`) for these arguments."""
        return self._step_buckets.lower(list(buffers), opt_state, batch)

    def _check_buckets(self, buffers: Sequence[jax.Array]) -> None:
        if len(buffers) != len(self.packed_buckets):
            raise ValueError(f"{len(buffers)} bucket buffers given; the plan has {len(self.packed_buckets)} buckets.")
        for b, (bk, buf) in enumerate(zip(self.packed_buckets, buffers)):
            want = (self.num_shards * bk.chunk_elems,)
            if tuple(buf.shape) != want or jnp.dtype(buf.dtype).name != bk.dtype:
                raise ValueError(f"bucket buffer {b} is {buf.dtype}{tuple(buf.shape)}; the plan expects {bk.dtype}{want}.")


def make_fsdp_step(loss_fn: Callable[[Any, Any], jax.Array], params: Any, optimizer: optax.GradientTransformation,
                   mesh: Mesh, *, axis: str = "fsdp", communication_size: int = 32 * MiB, layout: str = "row",
                   max_norm: float | None = None, dp_axis: str | None = None, return_grad_shards: bool = False,
                   num_microbatches: int = 1, defer_sync: bool = True, reduce_scatter: str = "auto",
                   order: Sequence[str] | None = None) -> FsdpStep:
    """Build an FSDP step that realises ``plan_shards(plan_buckets(spec, communication_size), N, layout)``.

    Args:
        loss_fn: ``loss_fn(params, local_batch) -> scalar``, the mean loss of a local batch.
        params: The parameter pytree (arrays or ``jax.ShapeDtypeStruct``), planned in
            ``jax.tree_util`` order unless ``order`` is given; later calls must pass the same structure, shapes,
            dtypes.
        optimizer: An elementwise optax transformation (see the module docstring).
        mesh: 1-D mesh ``(axis,)``, or 2-D ``(dp_axis, axis)`` for HSDP.
        axis: The sharding axis; N = ``mesh.shape[axis]``.
        communication_size: Bucket cap in bytes (MLX's rule; ``<= 0``: one bucket per array).
            Default: 32 MiB.
        layout: ``"row"`` (every array (N, -1); needs ``size % N == 0``) or ``"flat"``
            (bucket flattened and padded to a multiple of N).
        max_norm: Clip the averaged gradient to this global L2 norm (MLX's formula).
        dp_axis: HSDP: the replica axis; shards are summed over it, means divide by
            the world size.
        return_grad_shards: Debug: also return each device's averaged gradient shards.
        num_microbatches: G, micro-batches per step: each rank's rows split along axis 0
            into G equal, consecutive parts (:mod:`~workbench.adapters.jax.accum`). Default: 1.
        defer_sync: With G > 1: accumulate full local gradients and reduce-scatter once
            per bucket (True; an unsharded accumulator), or reduce-scatter every
            micro-batch and accumulate this rank's 1/N shards (False; G per bucket).
        reduce_scatter: ``"auto"`` (the default: ``"all_to_all"`` on CPU devices, ``"psum_scatter"``
            elsewhere), ``"psum_scatter"`` (XLA's reduce-scatter) or ``"all_to_all"`` (each row to
            its rank, then a local sum: on CPU over gloo 2.3x faster than XLA's, see
            :func:`~workbench.adapters.jax.step_base.reduce_scatter_rows`). Counted as a
            reduce-scatter either way; the step's ``reduce_scatter`` attribute says which ran.
        order: The parameters' paths (``spec_from_jax``'s) in the model's own order, which the buckets are
            planned over, as MLX plans a model's ``trainable_parameters()`` (its forward order), and as the
            strategy records count. Default: ``jax.tree_util`` order (a dict's keys sorted), which can cut
            buckets elsewhere and so issue another number of collectives than the model's order.

    Raises:
        ValueError: for an unknown axis, layout or reduce_scatter, an invalid ``num_microbatches`` or
            ``defer_sync``, an ``order`` that is not the pytree's paths, or (``row``) an array whose size
            N does not divide, naming its path and shape (from the planner).
    """
    return FsdpStep(loss_fn, params, optimizer, mesh, axis=axis, communication_size=communication_size, layout=layout,
                    max_norm=max_norm, dp_axis=dp_axis, return_grad_shards=return_grad_shards,
                    num_microbatches=num_microbatches, defer_sync=defer_sync, reduce_scatter=reduce_scatter,
                    order=order)


class DdpStep(StepBase):
    """The DDP reference; build it with :func:`make_ddp_step`.

    ``num_collectives``: one all-reduce per array (G per array with per-micro-batch sync).
    """

    def __init__(self, loss_fn, params, optimizer, mesh, *, axis, max_norm, return_grads, num_microbatches, defer_sync,
                 donate=False):
        check_accum(num_microbatches, defer_sync)
        self.num_microbatches, self.defer_sync = int(num_microbatches), bool(defer_sync)
        self.axes = axis_names(axis)
        check_mesh(mesh, self.axes)
        self.loss_fn, self.optimizer, self.max_norm, self.return_grads = loss_fn, optimizer, max_norm, return_grads
        self.spec = spec_from_jax(params, name="params")
        self.treedef = jax.tree_util.tree_structure(params)
        self.num_data = int(np.prod([mesh.shape[a] for a in self.axes]))
        self.collective_counts = counts(all_reduce=self.num_syncs * len(self.spec) if self.num_data > 1 else 0)
        metrics = {"loss": P(), "grad_norm": P()} | ({"grads": P()} if return_grads else {})
        self.param_sharding, self.batch_sharding = NamedSharding(mesh, P()), NamedSharding(mesh, P(self.axes))
        self._init = jax.jit(optimizer.init, out_shardings=self.param_sharding)
        self._live = tuple(a for a in self.axes if mesh.shape[a] > 1)
        self._step = smap(self._step_body, mesh, (P(), P(), P(self.axes)), (P(), P(), metrics), bool(self._live),
                          donate=(0, 1) if donate else ())

    def _step_body(self, params, opt_state, batch):
        live, g = self._live, self.num_microbatches
        value_and_grad, varying = jax.value_and_grad(self.loss_fn), vary(params, live)
        per_micro = self.num_syncs > 1
        sync = (lambda grads: jax.lax.pmean(grads, live)) if per_micro and live else None
        loss, grads = accumulate(lambda micro: value_and_grad(varying, micro), split_local(batch, g), sync)
        grads = jax.tree_util.tree_map(lambda a: a / g, grads) if g > 1 else grads
        if live and per_micro:
            loss = jax.lax.pmean(loss, live)
        elif live:
            grads, loss = jax.lax.pmean((grads, loss), live)
        leaves = self.treedef.flatten_up_to(grads)
        norm = jnp.sqrt(global_norm(leaves))
        clipped = self.treedef.unflatten(clip_leaves(leaves, norm, self.max_norm))
        updates, opt_state = self.optimizer.update(clipped, opt_state, params)
        metrics = {"loss": loss, "grad_norm": norm} | ({"grads": grads} if self.return_grads else {})
        return optax.apply_updates(params, updates), opt_state, metrics


def make_ddp_step(loss_fn: Callable[[Any, Any], jax.Array], params: Any, optimizer: optax.GradientTransformation,
                  mesh: Mesh, axis: str | Sequence[str] = "fsdp", max_norm: float | None = None, *,
                  return_grads: bool = False, num_microbatches: int = 1, defer_sync: bool = True,
                  donate: bool = False) -> DdpStep:
    """Build the data-parallel reference: gradients ``pmean``-ed over ``axis`` (a name or a tuple), full update.

    Same arguments and metrics as :func:`make_fsdp_step`; clipping uses the same formula.
    With G > 1, ``defer_sync`` all-reduces the accumulated gradients once (True) or every
    micro-batch's (False); the accumulator is full in both modes. ``donate``: ``step`` donates the
    parameters and optimizer state (XLA may update them in place; they are deleted), as FSDP's
    ``step_buckets`` does. Default: False.
    """
    return DdpStep(loss_fn, params, optimizer, mesh, axis=axis, max_norm=max_norm, return_grads=return_grads,
                   num_microbatches=num_microbatches, defer_sync=defer_sync, donate=donate)

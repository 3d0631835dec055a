"""JAX training steps that realise the core's bucket and shard plans: FSDP, HSDP, DDP.

* :func:`make_fsdp_step` -- MLX ``fsdp_apply_gradients`` in ``jax.shard_map``
  (parameters replicated, gradients and optimizer state sharded: ZeRO-2-like, PyTorch
  FSDP with ``reshard_after_forward=False``). Per bucket of
  ``plan_shards(plan_buckets(spec_from_jax(params), communication_size), N, layout)``:
  pack the gradients in the plan's layout, one ``psum_scatter``, optional clipping by
  the global norm, the optax update on the local slice, one ``all_gather``.
  ``dp_axis`` adds HSDP: shards are also summed over the replica axis (MLX #3194).
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

from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from workbench.adapters.jax.accum import accumulate, check_accum, check_batch, counts, split_local
from workbench.adapters.jax.base import spec_from_jax
from workbench.core.buckets import plan_buckets
from workbench.core.shards import ShardPlan, plan_shards
from workbench.core.specs import ModelSpec
from workbench.core.units import MiB

if hasattr(jax, "shard_map"):
    _shard_map, _CHECK = jax.shard_map, "check_vma"
else:  # jax < 0.6
    from jax.experimental.shard_map import shard_map as _shard_map

    _CHECK = "check_rep"

_EPS = 1e-6  # MLX's clip: scale = min(max_norm / (norm + 1e-6), 1)


class _Bucket(NamedTuple):
    """Static layout of one bucket: what ``pack`` and ``unpack`` need, read from the plan."""

    index: tuple[int, ...]  # parameter indices (flatten order) in concatenation order
    shapes: tuple[tuple[int, ...], ...]
    sizes: tuple[int, ...]
    chunks: tuple[int, ...]  # row: elements of each array per rank
    chunk_elems: int  # c: elements each rank holds of the bucket
    dtype: str


def _buckets(plan: ShardPlan) -> list[_Bucket]:
    bp, out = plan.buckets, []
    for b in range(bp.num_buckets):
        idx = [int(i) for i in bp.bucket(b)]
        ps = [bp.spec.params[i] for i in idx]
        assert len({p.dtype for p in ps}) == 1, "the planner never mixes dtypes in a bucket"
        out.append(_Bucket(tuple(idx), tuple(p.shape for p in ps), tuple(p.size for p in ps),
                           tuple(int(plan.param_chunk_elems[i]) for i in idx), int(plan.bucket_chunk_elems[b]), ps[0].dtype))
    return out


def _pack(bk: _Bucket, leaves: Sequence[jax.Array], n: int, layout: str) -> jax.Array:
    """The bucket as one 1-D buffer of N*c elements; elements [r*c, (r+1)*c) are rank r's."""
    if layout == "row":  # each array (N, -1), concatenated on axis 1: row r = rank r's slice of every array
        return jnp.concatenate([leaves[i].reshape(n, -1) for i in bk.index], axis=1).reshape(-1)
    flat = jnp.concatenate([leaves[i].reshape(-1) for i in bk.index])
    return jnp.pad(flat, (0, n * bk.chunk_elems - flat.shape[0]))


def _unpack(bk: _Bucket, buf: jax.Array, n: int, layout: str) -> list[jax.Array]:
    """Inverse of :func:`_pack`: the bucket's arrays, in their shapes."""
    if layout == "row":
        parts = jnp.split(buf.reshape(n, bk.chunk_elems), np.cumsum(bk.chunks)[:-1], axis=1)
    else:
        parts = jnp.split(buf[: sum(bk.sizes)], np.cumsum(bk.sizes)[:-1])
    return [p.reshape(s) for p, s in zip(parts, bk.shapes)]


def _smap(f: Callable, mesh: Mesh, in_specs: Any, out_specs: Any, communicates: bool) -> Callable:
    """``jit(shard_map(f))``. Without communication (one device) the replication check is off, so no
    implicit all-reduce is inserted and no single-device collective survives in the compiled program."""
    return jax.jit(_shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, **{_CHECK: communicates}))


def _vary(tree: Any, axes: tuple[str, ...]) -> Any:
    """Mark replicated values as varying over ``axes`` so that grad gives each device its local
    gradient (otherwise shard_map's type system would insert an all-reduce of its own)."""
    return jax.lax.pcast(tree, axes, to="varying") if axes else tree


def _axes(axis: str | Sequence[str] | None) -> tuple[str, ...]:
    return () if axis is None else (axis,) if isinstance(axis, str) else tuple(axis)


def _check_mesh(mesh: Mesh, axes: tuple[str, ...]) -> None:
    for a in axes:
        if a not in mesh.axis_names:
            raise ValueError(f"Mesh axis {a!r} not found; the mesh has axes {tuple(mesh.axis_names)}.")
    unused = [a for a in mesh.axis_names if a not in axes and mesh.shape[a] > 1]
    if unused:
        raise ValueError(f"Mesh axes {unused} are neither the sharding nor the data-parallel axis; name them or drop them.")


def _state_specs(optimizer: optax.GradientTransformation, local: Any, axis: str) -> Any:
    """Specs of the optimizer state: non-scalar leaves mirror the sharded params, scalars are replicated."""
    return jax.tree_util.tree_map(lambda s: P(axis) if s.ndim else P(), jax.eval_shape(optimizer.init, local))


def _global_norm(leaves: Sequence[jax.Array]) -> jax.Array:
    """Local sum of squares in float32, shape ()."""
    return sum((jnp.sum(jnp.square(g.astype(jnp.float32))) for g in leaves), jnp.zeros((), jnp.float32))


def _clip(leaves: list[jax.Array], norm: jax.Array, max_norm: float | None) -> list[jax.Array]:
    if max_norm is None:
        return leaves
    scale = jnp.minimum(max_norm / (norm + _EPS), 1.0)
    return [(g * scale).astype(g.dtype) for g in leaves]


class _StepBase:
    """Checks shared by the steps (errors name the path at fault), and :meth:`lower`."""

    spec: ModelSpec
    treedef: Any
    num_data: int
    num_microbatches: int = 1
    defer_sync: bool = True
    collective_counts: dict[str, int]

    @property
    def num_collectives(self) -> int:
        """Gradient-path collectives per step: the sum of :attr:`collective_counts`."""
        return sum(self.collective_counts.values())

    @property
    def num_syncs(self) -> int:
        """Gradient synchronisations per step: G with per-micro-batch sync, else 1."""
        return self.num_microbatches if not self.defer_sync else 1

    def _check_params(self, params: Any, what: str = "params") -> None:
        leaves, treedef = jax.tree_util.tree_flatten(params)
        if treedef != self.treedef:
            raise ValueError(f"{what} has tree structure {treedef}, but the step was planned for {self.treedef}.")
        for p, leaf in zip(self.spec.params, leaves):
            if tuple(leaf.shape) != p.shape or jnp.dtype(leaf.dtype).name != p.dtype:
                raise ValueError(f"{what} leaf '{p.path}' is {leaf.dtype}{tuple(leaf.shape)}; "
                                 f"the plan expects {p.dtype}{p.shape}.")

    def _check_batch(self, batch: Any) -> None:
        check_batch(batch, self.num_data, self.num_microbatches)

    def lower(self, *args: Any) -> jax.stages.Lowered:
        """The lowered step for these arguments: ``.as_text()`` shows every collective,
        ``.compile().memory_analysis()`` XLA's buffer sizes in bytes."""
        return self._step.lower(*args)

    def init(self, params: Any) -> Any:
        """The optimizer state for ``params`` (FSDP: per bucket a 1-D array of N*c elements
        sharded ``P(axis)``, so each device holds its 1/N; DDP: replicated)."""
        self._check_params(params)
        return self._init(params)

    def step(self, params: Any, opt_state: Any, batch: Any) -> tuple[Any, Any, dict]:
        """One step on the global batch (axis 0 split over all data-parallel ranks, then each
        rank's rows into G consecutive micro-batches).

        Returns:
            ``(params, opt_state, metrics)``: params replicated ``P()``; metrics ``loss``
            (global mean, over ranks and micro-batches), ``grad_norm`` (of the averaged
            gradient, before clipping) and
            ``num_collectives`` (int). Debug options add FSDP's ``grad_shards`` (per bucket
            the (N*c,) averaged gradient, device r holding [r*c, (r+1)*c)) or DDP's ``grads``.
        """
        self._check_params(params)
        self._check_batch(batch)
        params, opt_state, metrics = self._step(params, opt_state, batch)
        return params, opt_state, {**metrics, "num_collectives": self.num_collectives}


class FsdpStep(_StepBase):
    """An FSDP (or HSDP) training step; build it with :func:`make_fsdp_step`.

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
                 return_grad_shards, num_microbatches, defer_sync):
        check_accum(num_microbatches, defer_sync)
        self.num_microbatches, self.defer_sync = int(num_microbatches), bool(defer_sync)
        if layout not in ("row", "flat"):
            raise ValueError(f"FSDP layout must be 'row' or 'flat', got {layout!r}.")
        _check_mesh(mesh, _axes(axis) + _axes(dp_axis))
        self.mesh, self.axis, self.dp_axis, self.layout, self.max_norm = mesh, axis, dp_axis, layout, max_norm
        self.loss_fn, self.optimizer, self.return_grad_shards = loss_fn, optimizer, return_grad_shards
        self.num_shards = n = int(mesh.shape[axis])
        num_replicas = int(mesh.shape[dp_axis]) if dp_axis else 1
        self._dp = dp_axis if num_replicas > 1 else None  # a replica axis of size 1 needs no collective
        self.num_data = n * num_replicas
        self.spec = spec_from_jax(params, name="params")
        self.treedef = jax.tree_util.tree_structure(params)
        self.plan = plan_shards(plan_buckets(self.spec, communication_size), n, layout)
        self._buckets = _buckets(self.plan)
        plan, nb = self.plan, len(self._buckets)
        k = self.num_syncs
        self.collective_counts = counts(
            all_reduce=(max_norm is not None and n > 1) + (k * nb if num_replicas > 1 else 0),
            reduce_scatter=k * plan.num_reduce_scatters if n > 1 else 0,
            all_gather=plan.num_all_gathers if n > 1 else 0)
        local = [jax.ShapeDtypeStruct((bk.chunk_elems,), bk.dtype) for bk in self._buckets]
        specs = _state_specs(optimizer, local, axis)
        data = P(_axes(dp_axis) + (axis,))
        metrics = {"loss": P(), "grad_norm": P()} | ({"grad_shards": [P(axis)] * nb} if return_grad_shards else {})
        self.param_sharding, self.batch_sharding = NamedSharding(mesh, P()), NamedSharding(mesh, data)
        live = self.num_data > 1
        self._init = _smap(self._init_body, mesh, (P(),), specs, live)
        self._step = _smap(self._step_body, mesh, (P(), specs, data), (P(), specs, metrics), live)

    def _local_slices(self, leaves: Sequence[jax.Array]) -> list[jax.Array]:
        r = jax.lax.axis_index(self.axis)
        n, layout = self.num_shards, self.layout
        return [jax.lax.dynamic_slice_in_dim(_pack(bk, leaves, n, layout), r * bk.chunk_elems, bk.chunk_elems)
                for bk in self._buckets]

    def _init_body(self, params):
        return self.optimizer.init(self._local_slices(jax.tree_util.tree_leaves(params)))

    def _reduce(self, grads: Any, divisor: int | None) -> list[jax.Array]:
        """Local gradients -> per bucket this rank's summed shard (divided by ``divisor``, if given)."""
        n, axis, dp, layout = self.num_shards, self.axis, self._dp, self.layout
        g_leaves, shards = self.treedef.flatten_up_to(grads), []
        for bk in self._buckets:
            s = _pack(bk, g_leaves, n, layout)
            s = jax.lax.psum_scatter(s, axis, scatter_dimension=0, tiled=True) if n > 1 else s
            s = jax.lax.psum(s, dp) if dp else s
            shards.append(s / divisor if divisor else s)
        return shards

    def _step_body(self, params, opt_state, batch):
        n, axis, dp, layout, g = self.num_shards, self.axis, self._dp, self.layout, self.num_microbatches
        data_axes = _axes(dp) + ((axis,) if n > 1 else ())
        value_and_grad, varying = jax.value_and_grad(self.loss_fn), _vary(params, data_axes)
        if self.num_syncs > 1:  # reduce-scatter every micro-batch, accumulate this rank's shards
            loss, shards = accumulate(lambda micro: value_and_grad(varying, micro), split_local(batch, g),
                                      lambda grads: self._reduce(grads, None))
            shards = [s / (self.num_data * g) for s in shards]
        else:  # G=1, or deferred: accumulate full local gradients, reduce-scatter once
            loss, grads = accumulate(lambda micro: value_and_grad(varying, micro), split_local(batch, g))
            shards = self._reduce(grads, self.num_data * g)
        sq = _global_norm(shards)
        norm = jnp.sqrt(jax.lax.psum(sq, axis) if n > 1 else sq)
        clipped = _clip(shards, norm, self.max_norm)
        slices = self._local_slices(self.treedef.flatten_up_to(params))
        updates, opt_state = self.optimizer.update(clipped, opt_state, slices)
        new = optax.apply_updates(slices, updates)
        leaves: list = [None] * len(self.spec.params)
        for bk, s in zip(self._buckets, new):
            full = jax.lax.all_gather(s, axis, tiled=True, to="invarying") if n > 1 else s
            for i, a in zip(bk.index, _unpack(bk, full, n, layout)):
                leaves[i] = a
        metrics = {"loss": jax.lax.pmean(loss, data_axes) if data_axes else loss, "grad_norm": norm}
        if self.return_grad_shards:
            metrics["grad_shards"] = shards
        return self.treedef.unflatten(leaves), opt_state, metrics


def make_fsdp_step(loss_fn: Callable[[Any, Any], jax.Array], params: Any, optimizer: optax.GradientTransformation,
                   mesh: Mesh, *, axis: str = "fsdp", communication_size: int = 32 * MiB, layout: str = "row",
                   max_norm: float | None = None, dp_axis: str | None = None, return_grad_shards: bool = False,
                   num_microbatches: int = 1, defer_sync: bool = True) -> FsdpStep:
    """Build an FSDP step that realises ``plan_shards(plan_buckets(spec, communication_size), N, layout)``.

    Args:
        loss_fn: ``loss_fn(params, local_batch) -> scalar``, the mean loss of a local batch.
        params: The parameter pytree (arrays or ``jax.ShapeDtypeStruct``), planned in
            ``jax.tree_util`` order; later calls must pass the same structure, shapes, dtypes.
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

    Raises:
        ValueError: for an unknown axis or layout, an invalid ``num_microbatches`` or
            ``defer_sync``, or (``row``) an array whose size N does not divide, naming its
            path and shape (from the planner).
    """
    return FsdpStep(loss_fn, params, optimizer, mesh, axis=axis, communication_size=communication_size, layout=layout,
                    max_norm=max_norm, dp_axis=dp_axis, return_grad_shards=return_grad_shards,
                    num_microbatches=num_microbatches, defer_sync=defer_sync)


class DdpStep(_StepBase):
    """The DDP reference; build it with :func:`make_ddp_step`.

    ``num_collectives``: one all-reduce per array (G per array with per-micro-batch sync).
    """

    def __init__(self, loss_fn, params, optimizer, mesh, *, axis, max_norm, return_grads, num_microbatches, defer_sync):
        check_accum(num_microbatches, defer_sync)
        self.num_microbatches, self.defer_sync = int(num_microbatches), bool(defer_sync)
        self.axes = _axes(axis)
        _check_mesh(mesh, self.axes)
        self.loss_fn, self.optimizer, self.max_norm, self.return_grads = loss_fn, optimizer, max_norm, return_grads
        self.spec = spec_from_jax(params, name="params")
        self.treedef = jax.tree_util.tree_structure(params)
        self.num_data = int(np.prod([mesh.shape[a] for a in self.axes]))
        self.collective_counts = counts(all_reduce=self.num_syncs * len(self.spec) if self.num_data > 1 else 0)
        metrics = {"loss": P(), "grad_norm": P()} | ({"grads": P()} if return_grads else {})
        self.param_sharding, self.batch_sharding = NamedSharding(mesh, P()), NamedSharding(mesh, P(self.axes))
        self._init = jax.jit(optimizer.init, out_shardings=self.param_sharding)
        self._live = tuple(a for a in self.axes if mesh.shape[a] > 1)
        self._step = _smap(self._step_body, mesh, (P(), P(), P(self.axes)), (P(), P(), metrics), bool(self._live))

    def _step_body(self, params, opt_state, batch):
        live, g = self._live, self.num_microbatches
        value_and_grad, varying = jax.value_and_grad(self.loss_fn), _vary(params, live)
        per_micro = self.num_syncs > 1
        sync = (lambda grads: jax.lax.pmean(grads, live)) if per_micro and live else None
        loss, grads = accumulate(lambda micro: value_and_grad(varying, micro), split_local(batch, g), sync)
        grads = jax.tree_util.tree_map(lambda a: a / g, grads) if g > 1 else grads
        if live and per_micro:
            loss = jax.lax.pmean(loss, live)
        elif live:
            grads, loss = jax.lax.pmean((grads, loss), live)
        leaves = self.treedef.flatten_up_to(grads)
        norm = jnp.sqrt(_global_norm(leaves))
        clipped = self.treedef.unflatten(_clip(leaves, norm, self.max_norm))
        updates, opt_state = self.optimizer.update(clipped, opt_state, params)
        metrics = {"loss": loss, "grad_norm": norm} | ({"grads": grads} if self.return_grads else {})
        return optax.apply_updates(params, updates), opt_state, metrics


def make_ddp_step(loss_fn: Callable[[Any, Any], jax.Array], params: Any, optimizer: optax.GradientTransformation,
                  mesh: Mesh, axis: str | Sequence[str] = "fsdp", max_norm: float | None = None, *,
                  return_grads: bool = False, num_microbatches: int = 1, defer_sync: bool = True) -> DdpStep:
    """Build the data-parallel reference: gradients ``pmean``-ed over ``axis`` (a name or a tuple), full update.

    Same arguments and metrics as :func:`make_fsdp_step`; clipping uses the same formula.
    With G > 1, ``defer_sync`` all-reduces the accumulated gradients once (True) or every
    micro-batch's (False); the accumulator is full in both modes.
    """
    return DdpStep(loss_fn, params, optimizer, mesh, axis=axis, max_norm=max_norm, return_grads=return_grads,
                   num_microbatches=num_microbatches, defer_sync=defer_sync)

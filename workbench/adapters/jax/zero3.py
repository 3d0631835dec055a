"""ZeRO-3 in JAX: parameters, gradients and optimizer state all sharded, and the flax NNX seed problem.

* :func:`make_zero3_step` -- each unit's weights are stored (N, -1) at rest and gathered
  inside the differentiated function, so gradients arrive reduce-scattered.
* :func:`chain_units` -- the same unit chain as an ordinary ``loss(params, batch)``, for
  :func:`~workbench.adapters.jax.fsdp.make_ddp_step` as the reference.
* :func:`fsdp_step` / :func:`fsdp_step_sharded` -- the flax NNX seed problem, unsharded
  and under ZeRO-3.

Gradient accumulation (``num_microbatches``, ``defer_sync``) follows
:mod:`workbench.adapters.jax.accum`. Bucket packing, the shared checks, clipping and ``shard_map`` come from
:mod:`workbench.adapters.jax.fsdp`; optimizers must be elementwise for the same reason.
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
    check_mesh,
    clip_leaves,
    global_norm,
    pack_bucket,
    packed_buckets,
    smap,
    state_specs,
    unpack_bucket,
)
from workbench.core.buckets import plan_buckets
from workbench.core.shards import plan_shards
from workbench.core.specs import ModelSpec


def chain_units(apply_units: Sequence[Callable], loss_fn: Callable[[Any, Any], jax.Array]) -> Callable:
    """The ordinary ``loss(params, batch)`` of a unit chain (for :func:`~.jax_fsdp.make_ddp_step` on the same model)."""

    def loss(params, batch):
        h = batch
        for f, p in zip(apply_units, params):
            h = f(p, h)
        return loss_fn(h, batch)

    return loss


class Zero3Step(StepBase):
    """A ZeRO-3 step (parameters, gradients and optimizer state sharded); build it with :func:`make_zero3_step`.

    At rest every array of shape S is stored as (N, prod(S)/N), sharded ``P(axis)``: device
    r holds row r, the ``row`` layout of the core. Unit u's buckets come from
    ``plan_shards(plan_buckets(unit_spec, unit_bytes), N, "row")``: one bucket per unit
    (split only where the dtype changes), so one all-gather per unit in forward, its
    transpose (one reduce-scatter per unit) in backward, and with ``reshard_after_forward``
    a second all-gather per unit in backward (``jax.checkpoint``: the gathered weights are
    freed after the unit's forward and gathered again for its backward).

    With G micro-batches and per-micro-batch sync all of that happens G times, the 1/N
    gradient rows accumulated. Deferred sync (G > 1) gathers every unit once, before the
    first micro-batch, keeps the full weights for all G micro-batches (so
    ``reshard_after_forward`` does not apply), accumulates full local gradients and
    reduce-scatters each unit's buckets once.

    Attributes:
        plans: One :class:`~workbench.core.shards.ShardPlan` per unit.
        num_collectives: All-gathers + reduce-scatters per step (+1 all-reduce when clipping).
        collective_counts: The same by kind: ``{"all_reduce", "reduce_scatter", "all_gather"}``.
    """

    def __init__(self, apply_units, loss_fn, params, optimizer, mesh, *, axis, reshard_after_forward, max_norm,
                 num_microbatches, defer_sync):
        check_accum(num_microbatches, defer_sync)
        self.num_microbatches, self.defer_sync = int(num_microbatches), bool(defer_sync)
        units = list(params)
        if len(units) != len(apply_units):
            raise ValueError(f"{len(apply_units)} unit functions but {len(units)} parameter units; pass one per unit.")
        check_mesh(mesh, (axis,))
        self.apply_units, self.loss_fn, self.optimizer = list(apply_units), loss_fn, optimizer
        self.mesh, self.axis, self.max_norm, self.remat = mesh, axis, max_norm, reshard_after_forward
        self.num_shards = self.num_data = n = int(mesh.shape[axis])
        self.spec = spec_from_jax(units, name="units")  # paths "u.name"
        self.treedef = jax.tree_util.tree_structure(units)
        self.plans, self.packed_buckets, start = [], [], 0
        for u, unit in enumerate(units):
            count = len(jax.tree_util.tree_leaves(unit))
            sub = ModelSpec(f"unit {u}", self.spec.params[start:start + count])
            plan = plan_shards(plan_buckets(sub, max(sub.nbytes, 1)), n, "row")
            self.plans.append(plan)
            self.packed_buckets.append(packed_buckets(plan))
            start += count
        nb = sum(len(b) for b in self.packed_buckets)
        g, deferred = self.num_microbatches, self.deferred
        gathers = nb if deferred else g * nb * (2 if reshard_after_forward else 1)
        self.collective_counts = counts(all_reduce=max_norm is not None, reduce_scatter=nb * self.num_syncs,
                                        all_gather=gathers) if n > 1 else counts()
        local = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct((1, int(np.prod(a.shape)) // n), a.dtype), units)
        specs = state_specs(optimizer, local, axis)
        self.sharded, self.replicated = NamedSharding(mesh, P(axis)), NamedSharding(mesh, P())
        self.batch_sharding = self.sharded
        self._shard = jax.jit(lambda t: jax.tree_util.tree_map(lambda a: a.reshape(n, -1), t), out_shardings=self.sharded)
        shapes = [p.shape for p in self.spec.params]
        self._unshard = jax.jit(
            lambda t: self.treedef.unflatten([a.reshape(s) for a, s in zip(self.treedef.flatten_up_to(t), shapes)]),
            out_shardings=self.replicated)
        self._init = smap(optimizer.init, mesh, (P(axis),), specs, n > 1)
        metrics = {"loss": P(), "grad_norm": P()}
        self._step = smap(self._step_body, mesh, (P(axis), specs, P(axis)), (P(axis), specs, metrics), n > 1)

    def _gather(self, u: int, local_unit: Any) -> Any:
        """Unit u's full weights from the local rows (1, size/N): one tiled all-gather per bucket."""
        leaves, treedef = jax.tree_util.tree_flatten(local_unit)
        full: list = [None] * len(leaves)
        for bk in self.packed_buckets[u]:
            buf = jnp.concatenate([leaves[i] for i in bk.index], axis=1)  # (1, c)
            buf = jax.lax.all_gather(buf, self.axis, axis=0, tiled=True) if self.num_shards > 1 else buf  # (N, c)
            for i, a in zip(bk.index, unpack_bucket(bk, buf.reshape(-1), self.num_shards, "row")):
                full[i] = a
        return treedef.unflatten(full)

    @property
    def deferred(self) -> bool:
        """Whether a step gathers once and reduce-scatters once (deferred sync with G > 1)."""
        return self.defer_sync and self.num_microbatches > 1

    def _scatter(self, u: int, full_grads: Any) -> Any:
        """Unit u's full local gradients -> its (1, size/N) rows, summed over ranks: one psum_scatter per bucket."""
        leaves, treedef = jax.tree_util.tree_flatten(full_grads)
        rows: list = [None] * len(leaves)
        for bk in self.packed_buckets[u]:
            buf = pack_bucket(bk, leaves, self.num_shards, "row")  # (N*c,): elements [r*c, (r+1)*c) are rank r's
            buf = jax.lax.psum_scatter(buf, self.axis, scatter_dimension=0, tiled=True) if self.num_shards > 1 else buf
            for i, a in zip(bk.index, jnp.split(buf, np.cumsum(bk.chunks)[:-1])):
                rows[i] = a.reshape(1, -1)
        return treedef.unflatten(rows)

    def _step_body(self, sharded, opt_state, batch):
        def forward(local_units, micro):
            h = micro
            for u, (f, p) in enumerate(zip(self.apply_units, local_units)):
                run = lambda p, h, u=u, f=f: f(self._gather(u, p), h)  # noqa: E731
                h = (jax.checkpoint(run) if self.remat else run)(p, h)
            return self.loss_fn(h, micro)

        def forward_full(full_units, micro):
            h = micro
            for f, p in zip(self.apply_units, full_units):
                h = f(p, h)
            return self.loss_fn(h, micro)

        g, micro_batches = self.num_microbatches, split_local(batch, self.num_microbatches)
        if self.deferred:  # gather once, keep the full weights for all micro-batches, reduce-scatter once
            full = [self._gather(u, p) for u, p in enumerate(sharded)]
            value_and_grad = jax.value_and_grad(forward_full)
            loss, acc = accumulate(lambda micro: value_and_grad(full, micro), micro_batches)
            grads = [self._scatter(u, a) for u, a in enumerate(acc)]
        else:  # the transpose of all_gather: each micro-batch's grads arrive reduce-scattered
            value_and_grad = jax.value_and_grad(forward)
            loss, grads = accumulate(lambda micro: value_and_grad(sharded, micro), micro_batches)
        leaves = [a / (self.num_data * g) for a in self.treedef.flatten_up_to(grads)]
        sq = global_norm(leaves)
        n = self.num_shards
        norm = jnp.sqrt(jax.lax.psum(sq, self.axis) if n > 1 else sq)
        grads = self.treedef.unflatten(clip_leaves(leaves, norm, self.max_norm))
        updates, opt_state = self.optimizer.update(grads, opt_state, sharded)
        loss = jax.lax.pmean(loss, self.axis) if n > 1 else loss
        return optax.apply_updates(sharded, updates), opt_state, {"loss": loss, "grad_norm": norm}

    def init(self, params: Any) -> tuple[Any, Any]:
        """Shard full ``params`` at rest; returns ``(sharded_params, opt_state)``, both ``P(axis)``."""
        self._check_params(list(params))
        sharded = self._shard(list(params))
        return sharded, self._init(sharded)

    def unshard(self, sharded: Any) -> Any:
        """The full, replicated parameters (for checkpoints and checks; one gather of everything)."""
        return self._unshard(sharded)

    def step(self, sharded: Any, opt_state: Any, batch: Any) -> tuple[Any, Any, dict]:
        """One step; params stay sharded. Metrics as :meth:`~.jax_fsdp.FsdpStep.step`."""
        if jax.tree_util.tree_structure(sharded) != self.treedef:
            raise ValueError(f"sharded params have tree structure {jax.tree_util.tree_structure(sharded)}, "
                             f"but the step was planned for {self.treedef}.")
        self._check_batch(batch)
        sharded, opt_state, metrics = self._step(sharded, opt_state, batch)
        return sharded, opt_state, {**metrics, "num_collectives": self.num_collectives}


def make_zero3_step(apply_units: Sequence[Callable[[Any, Any], Any]], loss_fn: Callable[[Any, Any], jax.Array],
                    params: Sequence[Any], optimizer: optax.GradientTransformation, mesh: Mesh, *, axis: str = "fsdp",
                    reshard_after_forward: bool = True, max_norm: float | None = None, num_microbatches: int = 1,
                    defer_sync: bool = True) -> Zero3Step:
    """Build a fully sharded (ZeRO-3) step over a chain of units (e.g. layers).

    The model is ``h = batch; h = apply_units[u](unit_params[u], h) for each u; loss_fn(h, batch)``
    (:func:`chain_units` gives the same model as an ordinary ``loss(params, batch)``).

    Args:
        apply_units: One function per unit, ``f(unit_params, h) -> h``; the first gets the
            local batch, and receives the unit's *full* weights, gathered just before it runs.
        loss_fn: ``loss_fn(h_last, local_batch) -> scalar`` mean loss.
        params: A sequence of unit pytrees (full arrays; every size divisible by N).
        optimizer: An elementwise optax transformation (it sees (1, size/N) rows).
        mesh: A mesh with the single axis ``axis``.
        reshard_after_forward: Free gathered weights after each unit's forward and gather
            again in backward (``jax.checkpoint``); False keeps them (ZeRO-2-like memory).
        max_norm: Clip by the global gradient norm, as in :func:`~.jax_fsdp.make_fsdp_step`.
        num_microbatches: G, micro-batches per step (each rank's rows split along axis 0). Default: 1.
        defer_sync: With G > 1: gather every unit once, keep the full weights and an unsharded
            gradient accumulator for all G micro-batches, reduce-scatter once per bucket (True);
            or gather and reduce-scatter every micro-batch, accumulating 1/N rows (False).

    Usage::

        z = make_zero3_step([layer, layer, head], mse, units, optax.adamw(1e-3), mesh)
        sharded, state = z.init(units)
        sharded, state, metrics = z.step(sharded, state, batch)
        units = z.unshard(sharded)

    Raises:
        ValueError: on a count mismatch, an invalid ``num_microbatches`` or ``defer_sync``, or
            an array whose size N does not divide (by path and shape).
    """
    return Zero3Step(apply_units, loss_fn, params, optimizer, mesh, axis=axis,
                     reshard_after_forward=reshard_after_forward, max_norm=max_norm,
                     num_microbatches=num_microbatches, defer_sync=defer_sync)


def _nnx_linear(seed: int, x: Any, y: Any):
    from flax import nnx

    return nnx.Linear(np.shape(x)[-1], np.shape(y)[-1], rngs=nnx.Rngs(seed))


def fsdp_step(seed: float, x: Any, y: Any, num_shards: float, lr: float) -> jax.Array:
    """The seed problem: one unsharded NNX step, the numerics any FSDP run of it must reproduce.

    Args:
        seed: Cast to int; seeds ``nnx.Linear(D_in, D_out)``.
        x: (B, D_in) inputs. y: (B, D_out) targets.
        num_shards: Informational (cast to int): the layout a production run would use.
        lr: SGD learning rate.

    Returns:
        (1,) float32: the mean squared error before the update.
    """
    from flax import nnx

    seed, num_shards, lr = int(seed), int(num_shards), float(lr)
    x, y = jnp.asarray(x), jnp.asarray(y)
    model = _nnx_linear(seed, x, y)
    optimizer = nnx.Optimizer(model, optax.sgd(lr), wrt=nnx.Param)

    def loss_fn(model, x, y):
        return jnp.mean((model(x) - y) ** 2)

    loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
    optimizer.update(model, grads)
    return jnp.array([float(loss)])


def fsdp_step_sharded(seed: float, x: Any, y: Any, num_shards: float, lr: float, *, devices: Sequence | None = None):
    """The seed's production recipe, really sharded: the same step as :func:`fsdp_step` under ZeRO-3.

    The Linear's kernel and bias are stored (N, -1) across ``num_shards`` devices, gathered
    just before the matmul, gradients reduce-scattered, SGD applied to the local rows.
    Needs ``B``, ``D_in*D_out`` and ``D_out`` divisible by ``num_shards``.

    Returns:
        ``(loss, model)``: the (1,) pre-update loss and the updated ``nnx.Linear``.
    """
    from flax import nnx

    seed, n, lr = int(seed), int(num_shards), float(lr)
    model = _nnx_linear(seed, x, y)
    graphdef, state = nnx.split(model, nnx.Param)
    pure = nnx.to_pure_dict(state)

    def apply(p, batch):
        local_state = jax.tree_util.tree_map(lambda a: a, state)
        nnx.replace_by_pure_dict(local_state, p)
        return nnx.merge(graphdef, local_state)(batch[0])

    devices = list(devices if devices is not None else jax.devices())
    if len(devices) < n:
        raise ValueError(f"num_shards={n} needs {n} devices; {len(devices)} available.")
    mesh = Mesh(np.array(devices[:n]), ("fsdp",))
    z = make_zero3_step([apply], lambda h, batch: jnp.mean((h - batch[1]) ** 2), [pure], optax.sgd(lr), mesh)
    sharded, opt_state = z.init([pure])
    sharded, _, metrics = z.step(sharded, opt_state, (jnp.asarray(x), jnp.asarray(y)))
    nnx.replace_by_pure_dict(state, z.unshard(sharded)[0])
    nnx.update(model, state)
    return jnp.array([float(metrics["loss"])]), model

"""FSDP in MLX with its state kept in the bucket's own layout for the run (issue 30).

:func:`~workbench.adapters.mlx.fsdp.fsdp_apply_gradients` is stateless between calls: every step it cuts
this rank's row of every parameter bucket again (:func:`~workbench.adapters.mlx.rows.bucket_row`, a
concatenation of 1/N of the model) to hand the optimizer, and its caller keeps the parameter tree.
:class:`ResidentFsdp` keeps, per bucket, this rank's master shard (the ``c`` elements the plan gives it, in
the plan's ``row`` or ``flat`` layout) and the optimizer state keyed by the same bucket, for the whole run.
A step is then: the gradient buckets reduce-scattered (:func:`~workbench.adapters.mlx.fsdp.shard_gradients`,
the same code), optional clipping, one optimizer call over the bucket shards (one ``apply_single`` per
bucket), and per bucket one all-gather whose result the model reads as views
(:func:`~workbench.adapters.mlx.rows.rebuild_arrays`: slices of the gathered buffer; under ``row`` a
bucket of several arrays is read through strided slices, which MLX copies where an op needs them contiguous).

What lazy evaluation leaves: the gradients come out of ``mx.value_and_grad`` as separate arrays, so the
reduce-scatter's operand is still built by one concatenation per bucket (:func:`bucket_matrix`); the
parameter rows are never concatenated again. The arithmetic is :func:`fsdp_apply_gradients`' (the master
shard is bit for bit the row it would cut from the gathered parameters), so the two are fp32 bit-identical.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from workbench.adapters.mlx.agree import agree_on_step
from workbench.adapters.mlx.fsdp import check_step_knobs, clip_by_global_norm, shard_gradients
from workbench.adapters.mlx.rows import bucket_row, check_trees, get_plan, rebuild_arrays
from workbench.adapters.mlx.transport import REDUCE_SCATTER_TRANSPORTS, gather_bucket, resolve_transport
from workbench.core.units import MiB

__all__ = ["ResidentFsdp"]


class ResidentFsdp:
    """An FSDP trainer's resident state: per bucket this rank's master shard, the optimizer state of it, and
    the gathered parameter buffer the model reads.

    Args:
        parameters: The initial parameter tree (identical on every rank); a non-empty tree of arrays.
        optimizer: An elementwise MLX optimizer; its state is created for the local shards, keyed by bucket.
        group: The group to shard over. Default: the global group.
        communication_size: Bucket cap in bytes (MLX's rule). Default: 32 MiB.
        layout: ``"row"`` or ``"flat"``, as :func:`~workbench.adapters.mlx.fsdp.fsdp_apply_gradients`.
        max_norm: Clip to this global gradient norm before the update, if given.
        reduce_scatter: The transport, as :func:`~workbench.adapters.mlx.fsdp.fsdp_apply_gradients`.
        stream: Stream for the collectives. Default: the backend's.

    Attributes:
        plan: The :class:`~workbench.core.shards.ShardPlan` realised.
        shards: ``{str(bucket): 1-D array of c elements}``, this rank's master shards (the optimizer's keys).
        rank_check_s: Seconds of the ranks' plan check (first construction of a plan), or None.

    Raises:
        ValueError: an unknown layout or transport, a bad knob, an empty tree, or (``row``) an array N
            does not divide (from the planner); ``RanksDisagree`` when the ranks' plans differ.
    """

    def __init__(self, parameters: Any, optimizer: Any, group: mx.distributed.Group | None = None,
                 communication_size: int = 32 * MiB, layout: str = "row", max_norm: float | None = None,
                 reduce_scatter: str = "auto", stream: Any = None):
        if layout not in ("row", "flat"):
            raise ValueError(f"Unknown layout {layout!r}; ResidentFsdp supports 'row' and 'flat'.")
        check_step_knobs(max_norm, communication_size)
        if reduce_scatter not in REDUCE_SCATTER_TRANSPORTS:
            raise ValueError(f"Unknown reduce_scatter {reduce_scatter!r}; choose one of "
                             f"{', '.join(REDUCE_SCATTER_TRANSPORTS)}.")
        self.group = group or mx.distributed.init()
        self.optimizer, self.max_norm, self.stream, self.layout = optimizer, max_norm, stream, layout
        self._flat = tree_flatten(parameters)
        if not self._flat:
            raise ValueError("ResidentFsdp needs a non-empty parameter tree.")
        self.plan = get_plan(self._flat, communication_size, self.group.size(), layout)
        self.transport = resolve_transport(self.group, reduce_scatter)
        self.rank_check_s = agree_on_step(self.group, self.plan, self._flat, layout=layout,
                                          communication_size=communication_size, max_norm=max_norm,
                                          transport=self.transport)
        arrays, rank = [a for _, a in self._flat], self.group.rank()
        self.shards = {str(b): bucket_row(arrays, self.plan, rank, b) for b in range(self.plan.buckets.num_buckets)}
        mx.eval(self.shards)

    def parameters(self) -> Any:
        """The full parameter tree: views of the gathered buffers (the initial arrays before the first step)."""
        return tree_unflatten(list(self._flat))

    def holds(self, parameters_flat: list[tuple[str, mx.array]]) -> bool:
        """Whether ``parameters_flat`` (``tree_flatten`` of the model's parameters) are the very arrays this
        state last handed out, so its master shards are theirs: False once the model was changed from outside
        (loaded, updated by other code), and the caller should cut a new state from the model."""
        return len(parameters_flat) == len(self._flat) and all(
            k == k2 and a is b for (k, a), (k2, b) in zip(parameters_flat, self._flat))

    def step(self, gradients: Any):
        """One optimizer step on the full local ``gradients`` (same tree as the parameters).

        Returns:
            The new parameter tree (:meth:`parameters`), or ``(tree, grad_norm)`` with ``max_norm``, as
            :func:`~workbench.adapters.mlx.fsdp.fsdp_apply_gradients` returns.
        """
        grads_flat = tree_flatten(gradients)
        check_trees(grads_flat, self._flat)
        grad_shards = shard_gradients(grads_flat, self.plan, self.group, None, self.transport, self.stream)
        del grads_flat
        tree, norm = self.apply_shards(grad_shards)
        return tree if self.max_norm is None else (tree, norm)

    def apply_shards(self, grad_shards: dict[str, mx.array]) -> tuple[Any, mx.array | None]:
        """The step after the reduce-scatter: ``grad_shards`` (``{str(bucket): 1-D shard of c elements}``, this
        rank's part of the averaged gradient, as :func:`~workbench.adapters.mlx.fsdp.shard_gradients` returns
        it, or summed over micro-batches) clipped, the optimizer on the master shards, every bucket gathered.

        ``grad_shards`` is emptied (its shards released as the update consumes them).

        Returns:
            ``(tree, grad_norm)``: the new parameter tree and the global norm before clipping (None without
            ``max_norm``).
        """
        if sorted(grad_shards) != sorted(self.shards):
            raise ValueError(f"grad_shards must have one shard per bucket of the plan ({sorted(self.shards)}), "
                             f"got {sorted(grad_shards)}.")
        norm = None
        if self.max_norm is not None:
            clipped, norm = clip_by_global_norm(grad_shards, self.max_norm, self.group, self.stream)
            grad_shards.clear()
            grad_shards.update(clipped)
            del clipped
        new = dict(self.optimizer.apply_gradients(grad_shards, self.shards))  # one apply_single per bucket shard
        grad_shards.clear()
        arrays, bp = [a for _, a in self._flat], self.plan.buckets
        for b in range(bp.num_buckets):
            # As fsdp_apply_gradients: each bucket's update evaluated before its all-gather is posted (the ring
            # backend's receive polls a core), one bucket's buffers alive at a time.
            shard = new.pop(str(b))
            mx.eval(shard)
            self.shards[str(b)] = shard
            views = rebuild_arrays(gather_bucket(shard, self.group, self.stream), arrays, self.plan, b)
            mx.eval(views)
            for i, view in zip(bp.bucket(b).tolist(), views):
                self._flat[i] = (self._flat[i][0], view)
        return self.parameters(), norm

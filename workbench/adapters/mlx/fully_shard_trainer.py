"""MLX's own ``fully_shard`` in the shape of the workbench's trainers (``step``, ``report``, ``phase_hook``).

A run's rank program drives every strategy through one interface
(:class:`workbench.adapters.mlx.accum.AccumTrainer`, :class:`~workbench.adapters.mlx.accum.Zero3Trainer`):
``loss, norm = trainer.step(loss_fn, inputs, targets)``. :class:`FullyShardTrainer` is that interface
around MLX's own ``fully_shard`` (not a reimplementation): the model is wrapped unit by unit
(:func:`~workbench.adapters.mlx.fully_shard.fully_shard_units`), each step builds its backward graph
inside :func:`~workbench.adapters.mlx.fully_shard.supply_sum_scatter`, clips with MLX's
``clip_grad_norm_sharded`` and updates the shards with the optimizer.
"""

from __future__ import annotations

from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map

from workbench.adapters.mlx.accum import PhasedTrainer, split_microbatches
from workbench.adapters.mlx.base import spec_from_mlx
from workbench.adapters.mlx.fully_shard import full_parameters, fully_shard_units, supply_sum_scatter
from workbench.core.fully_shard_plan import plan_fully_shard


class FullyShardTrainer(PhasedTrainer):
    """One optimizer step of a ``fully_shard``-wrapped model over G micro-batches.

    Every micro-batch gathers and reduce-scatters every unit (``fully_shard`` cannot defer the sync);
    the 1/N gradient rows are summed over micro-batches and divided by G, so the step equals one step
    on the whole local batch.

    Args:
        model: The unwrapped model (identical on every rank); wrapped in place, innermost unit first.
        optimizer: An MLX optimizer; its state is created for the shards, 1/N of DDP's.
        group: Default: the global group.
        units: Module paths to wrap (default: every transformer block), the root always last.
        compute_dtype: ``fully_shard``'s ``compute_dtype`` (gathered weights and reduce-scattered gradients).
        max_norm: Clip by the global norm (``mlx.nn.utils.clip_grad_norm_sharded``) if given.
        num_microbatches: G.
        defer_sync: Must be False (``fully_shard`` reduce-scatters in every backward).

    Attributes:
        model: The wrapped root; its parameters are this rank's rows.
        plan: The :class:`~workbench.core.fully_shard_plan.FullyShardPlan` it was wrapped by.
        report: The last step's ``num_all_gathers``, ``num_reduce_scatters``, ``num_all_sums``, the
            reduce-scatter transport (``"sum_scatter"`` native, ``"ring"`` supplied) and the ring's way.
        phase_hook: Called with ``"accumulated"`` after the micro-batch loop and ``"updated"`` after the update.

    Raises:
        ValueError: ``defer_sync`` with G > 1, a bad G, or (before wrapping) every parameter
            ``fully_shard`` would refuse.
    """

    def __init__(self, model: nn.Module, optimizer: Any, group: Any = None, *, units: list[str] | None = None,
                 compute_dtype: Any = None, max_norm: float | None = None, num_microbatches: int = 1,
                 defer_sync: bool = False):
        if defer_sync and num_microbatches > 1:
            raise ValueError("defer_sync=True: MLX's fully_shard reduce-scatters in every backward and cannot defer "
                             "the sync to the last micro-batch; use defer_sync=False.")
        self.group = group or mx.distributed.init()
        self.plan = plan_fully_shard(spec_from_mlx(model, trainable_only=False), self.group.size(), units=units,
                                     compute_dtype=None if compute_dtype is None else str(compute_dtype),
                                     num_microbatches=num_microbatches)
        self.model = fully_shard_units(model, self.group, units=units, compute_dtype=compute_dtype)
        self.optimizer, self.max_norm, self.num_microbatches = optimizer, max_norm, num_microbatches
        self.report: dict = {}

    def step(self, loss_fn: Callable, *batch: mx.array) -> tuple[mx.array, mx.array | None]:
        """One step on this rank's ``batch``: ``(mean loss, global gradient norm or None)``, evaluated."""
        g, n = self.num_microbatches, self.group.size()
        acc, losses = None, []
        with supply_sum_scatter(self.group) as supply:
            value_and_grad = nn.value_and_grad(self.model, loss_fn)
            for micro in split_microbatches(batch, g):
                loss, grads = value_and_grad(self.model, *micro)
                acc = grads if acc is None else tree_map(mx.add, acc, grads)
                losses.append(loss)
                mx.eval(acc, loss)  # frees the micro-batch's graph and its gathered weights
        loss = mx.mean(mx.stack(losses))
        if g > 1:
            acc = tree_map(lambda a: a * (1.0 / g), acc)
        self._phase("accumulated")
        norm = None
        if self.max_norm is not None:
            acc, norm = nn.utils.clip_grad_norm_sharded(acc, self.max_norm, group=self.group)
        self.optimizer.update(self.model, acc)
        mx.eval(self.model.parameters(), self.optimizer.state, loss, *([norm] if norm is not None else []))
        summary = self.plan.summary()
        self.report = dict(strategy="mlx-fully-shard", num_microbatches=g, defer_sync=False,
                           num_units=summary["num_units"], num_all_gathers=summary["num_all_gathers"],
                           num_reduce_scatters=summary["num_reduce_scatters"],
                           num_supplied_reduce_scatters=supply.num_calls,
                           num_all_sums=int(self.max_norm is not None and n > 1),
                           reduce_scatter_transport="ring" if supply.supplied else "sum_scatter",
                           ring_transport=supply.transport,
                           all_gather_bytes_sent=summary["all_gather_bytes_sent"],
                           reduce_scatter_bytes_sent=summary["reduce_scatter_bytes_sent"])
        self._phase("updated")
        return loss, norm

    def full_parameters(self) -> dict[str, mx.array]:
        """``{original path: full array}`` (gathered; for checks and checkpoints)."""
        return full_parameters(self.model, self.group)

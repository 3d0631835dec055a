"""The full-sharding (ZeRO-3) trainer over G micro-batches: :func:`make_zero3_trainer`.

Built on :mod:`workbench.adapters.mlx.zero3` (the sharded units) and the micro-batch pieces of
:mod:`workbench.adapters.mlx.accum`. Per-micro-batch sync gathers and reduce-scatters every unit in every
micro-batch; deferred sync gathers every unit once and keeps the full weights for all G micro-batches.
"""

from __future__ import annotations

from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map, tree_unflatten

from workbench.adapters.mlx.accum import PhasedTrainer, accumulate_microbatches, check_microbatches, split_microbatches
from workbench.adapters.mlx.fsdp import clip_by_global_norm
from workbench.adapters.mlx.transport import ring_transport
from workbench.adapters.mlx.zero3 import Zero3Model, shard_model


class Zero3Trainer(PhasedTrainer):
    """A full-sharding step over G micro-batches; build it with :func:`make_zero3_trainer`.

    Attributes:
        model: The :class:`~workbench.adapters.mlx.zero3.Zero3Model`; its trainable parameters are this rank's rows.
        report: The last step's ``num_all_gathers``, ``num_reduce_scatters``, ``num_all_sums``
            and bytes sent per rank, counted as the collectives were issued.
        phase_hook: As in :class:`~workbench.adapters.mlx.accum.AccumTrainer`.
    """

    def __init__(self, model: Zero3Model, optimizer: Any, *, max_norm: float | None, num_microbatches: int,
                 defer_sync: bool):
        self.model, self.optimizer, self.max_norm = model, optimizer, max_norm
        self.num_microbatches, self.defer_sync = num_microbatches, defer_sync
        self.report: dict = {}

    def step(self, loss_fn: Callable, *batch: mx.array) -> tuple[mx.array, mx.array | None]:
        """One optimizer step, as :meth:`~workbench.adapters.mlx.accum.AccumTrainer.step`.

        Per-micro-batch sync gathers and reduce-scatters every unit in every micro-batch (with
        ``reshard_after_forward``, gathers twice), accumulating 1/N rows; deferred sync gathers
        every unit once, keeps the full weights for all G micro-batches, accumulates full local
        gradients and reduce-scatters each unit once, after the final micro-batch.
        """
        z, g = self.model, self.num_microbatches
        n, defer = z.comm.group.size(), self.defer_sync and g > 1
        micro_batches = split_microbatches(batch, g)
        z.comm.take()
        if defer:
            z.set_full(True)
        try:
            loss, acc, _ = accumulate_microbatches(nn.value_and_grad(z, loss_fn), z, micro_batches, None)
            self._phase("accumulated")
        finally:
            z.set_full(False)
        if defer:
            flat = dict(tree_flatten(acc))
            for unit, where in zip(z.units, z.unit_paths()):
                keys = [f"{where}.module.{p}" if where else f"module.{p}" for p in unit._z.paths]
                flat.update(zip(keys, unit.scatter([flat[k] for k in keys], 1.0 / (n * g))))
            acc = tree_unflatten(list(flat.items()))
        elif g > 1:
            acc = tree_map(lambda a: a * (1.0 / g), acc)
        mx.eval(acc)  # a deferred full accumulator is freed here, before the update
        norm = None
        if self.max_norm is not None:
            clipped, norm = clip_by_global_norm(dict(tree_flatten(acc)), self.max_norm, z.comm.group)
            acc = tree_unflatten(list(clipped.items()))
        self.optimizer.update(z, acc)
        mx.eval(z.parameters(), self.optimizer.state, loss, *([norm] if norm is not None else []))
        self.report = dict(strategy="full", num_microbatches=g, defer_sync=self.defer_sync, num_units=len(z.units),
                           num_resharded_units=sum(u.reshards for u in z.units),
                           reduce_scatter_transport=z.comm.transport, ring_transport=ring_transport(z.comm.transport, n),
                           num_all_gathers=0, num_reduce_scatters=0,
                           num_all_sums=int(self.max_norm is not None and n > 1)) | z.comm.take()
        self._phase("updated")
        return loss, norm

    def full_parameters(self) -> dict[str, mx.array]:
        """``{original path: full array}`` of the model (gathered; for checks and checkpoints)."""
        return self.model.full_parameters()


def make_zero3_trainer(model: nn.Module, optimizer: Any, group: mx.distributed.Group | None = None, *,
                       units: list[str] | None = None, reshard_after_forward: bool = True,
                       reduce_scatter: str = "auto", max_norm: float | None = None, num_microbatches: int = 1,
                       defer_sync: bool = True) -> Zero3Trainer:
    """Shard ``model`` in place (:func:`~workbench.adapters.mlx.zero3.shard_model`) and return its trainer.

    Args:
        model, group, units, reshard_after_forward, reduce_scatter: As in ``shard_model``.
        optimizer: An MLX optimizer; its state is created for this rank's rows only (1/N).
        max_norm, num_microbatches, defer_sync: As in :func:`~workbench.adapters.mlx.accum.make_trainer`.

    Usage::

        trainer = make_zero3_trainer(MLXLM(cfg), optim.AdamW(1e-3), num_microbatches=4)
        loss, grad_norm = trainer.step(lm_loss, inputs, targets)
        params = trainer.full_parameters()

    Raises:
        ValueError: on an invalid knob (named), a unit that is no submodule, or a parameter
            whose size the group size does not divide (by path and shape).
    """
    check_microbatches(num_microbatches, defer_sync, max_norm)
    z = shard_model(model, group, units=units, reshard_after_forward=reshard_after_forward,
                    reduce_scatter=reduce_scatter)
    return Zero3Trainer(z, optimizer, max_norm=max_norm, num_microbatches=num_microbatches, defer_sync=defer_sync)

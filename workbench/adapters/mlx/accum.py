"""MLX training steps with gradient accumulation: sync every micro-batch, or once per step (deferred).

With G micro-batches per step, a naive data-parallel step synchronises each micro-batch's
gradient (DDP: G all-reduces per bucket; FSDP: G reduce-scatters per bucket; full
sharding: G gathers and reduce-scatters per unit); the deferred mode (NeMo Automodel's
``prepare_for_grad_accumulation`` / ``prepare_for_final_backward``) accumulates local
gradients and synchronises once, after the final micro-batch. Both give the step of one
large batch (equal micro-batches, mean losses): the gradient is ``sum / (G * N)``.

Memory: deferral keeps an unsharded gradient accumulator (FSDP, full sharding) and, under
full sharding, every unit's gathered weights for the whole step; the per-micro-batch
accumulator is this rank's 1/N. DDP's is full in both modes. Accumulation is in the
gradient's dtype.

DDP is built on :func:`~workbench.adapters.mlx.fsdp.ddp_apply_gradients`. FSDP keeps its state resident in
the bucket layout for the run (issue 30: :class:`~workbench.adapters.mlx.resident.ResidentFsdp`, each bucket's
master shard and optimizer state; no parameter rows cut per step), fp32 bit-identical to
:func:`~workbench.adapters.mlx.fsdp.fsdp_apply_gradients`: deferred, its ``step``; per micro-batch,
:func:`~workbench.adapters.mlx.fsdp.shard_gradients` every micro-batch and its ``apply_shards``. Full sharding is
:mod:`workbench.adapters.mlx.zero3_trainer`, on the pieces here (micro-batches, :class:`PhasedTrainer`).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map, tree_unflatten

from workbench.adapters.mlx.fsdp import clip_by_global_norm, ddp_apply_gradients, shard_gradients
from workbench.adapters.mlx.resident import ResidentFsdp
from workbench.adapters.mlx.rows import get_plan
from workbench.adapters.mlx.transport import (
    REDUCE_SCATTER_TRANSPORTS,
    resolve_transport,
    ring_transport,
)
from workbench.core.checks import integer
from workbench.core.units import MiB
from workbench.strategies import get_strategy


def check_microbatches(num_microbatches: int, defer_sync: bool, max_norm: float | None) -> None:
    """Raise ``ValueError`` naming the knob if ``num_microbatches``, ``defer_sync`` or ``max_norm`` is invalid."""
    integer("num_microbatches", num_microbatches, low=1)
    if not isinstance(defer_sync, bool):
        raise ValueError(f"defer_sync must be True or False, got {defer_sync!r}.")
    if max_norm is not None and not max_norm > 0:
        raise ValueError(f"max_norm must be positive (or None), got {max_norm!r}.")


def split_microbatches(batch: tuple, num_microbatches: int) -> list[tuple]:
    """Split every array of ``batch`` along axis 0 into ``num_microbatches`` equal, consecutive parts.

    Raises:
        ValueError: if an array's leading size is not divisible by ``num_microbatches``, naming both.
    """
    g = num_microbatches
    for i, a in enumerate(batch):
        if a.ndim == 0 or a.shape[0] % g:
            raise ValueError(f"num_microbatches={g} must divide the local batch: argument {i} has shape "
                             f"{tuple(a.shape)}, whose axis 0 is not divisible by {g}.")
    return [tuple(a[k * (a.shape[0] // g):(k + 1) * (a.shape[0] // g)] for a in batch) for k in range(g)]


def accumulate_microbatches(value_and_grad: Callable, model: Any, micro_batches: list, sync: Callable | None):
    """Sum over micro-batches of ``sync(grads)`` (or of the local grads).

    Returns ``(mean loss, sum, seconds spent in sync)``: each micro-batch's backward is evaluated
    before its sync starts (its activations are freed before the sync's buffers appear), and the
    sync is evaluated on its own, so its time is the collectives' (and their packing's) alone.
    """
    acc, losses, sync_s = None, [], 0.0
    for micro in micro_batches:
        loss, grads = value_and_grad(model, *micro)
        if sync is not None:
            mx.eval(loss, grads)
            t0 = time.perf_counter()
            grads = sync(grads)
            mx.eval(grads)
            sync_s += time.perf_counter() - t0
        acc = grads if acc is None else tree_map(mx.add, acc, grads)
        losses.append(loss)
        mx.eval(acc, loss)
    return mx.mean(mx.stack(losses)), acc, sync_s


class PhasedTrainer:
    """What every trainer shares: ``phase_hook`` (called with a phase's name as the step reaches it)."""

    phase_hook: Callable[[str], None] | None = None

    def _phase(self, name: str) -> None:
        if self.phase_hook is not None:
            self.phase_hook(name)


class AccumTrainer(PhasedTrainer):
    """A DDP or FSDP (no parameter sharding) step over G micro-batches; build it with :func:`make_trainer`.

    Attributes:
        report: The last step's collectives, as the step issues them (buckets times syncs):
            ``num_all_sums`` (DDP buckets, clipping), ``num_reduce_scatters`` /
            ``num_all_gathers`` (FSDP buckets; one reduce-scatter is one collective whatever its
            transport), ``num_buckets``, and ``sync_time_s`` (seconds in the syncs: inside the
            micro-batch loop when every micro-batch syncs, plus the step's own sync and update).
        phase_hook: If set, called with ``"accumulated"`` once the micro-batch loop is
            evaluated and ``"updated"`` at the end of the step (e.g. to read peak memory per phase).
    """

    def __init__(self, model: nn.Module, optimizer: Any, group: mx.distributed.Group, *, strategy: Any,
                 num_microbatches: int, defer_sync: bool, communication_size: int, layout: str,
                 reduce_scatter: str, max_norm: float | None):
        self.model, self.optimizer, self.group, self.record = model, optimizer, group, strategy  # a Strategy
        self.num_microbatches, self.defer_sync, self.max_norm = num_microbatches, defer_sync, max_norm
        self.communication_size, self.layout = communication_size, layout
        self.transport = resolve_transport(group, reduce_scatter)
        self.resident: ResidentFsdp | None = None  # FSDP: the state kept in the bucket layout, from the first step
        self.report: dict = {}

    def _resident_state(self, params_flat: list) -> tuple[ResidentFsdp, float | None]:
        """FSDP's resident state for the model's parameters, and the seconds of the ranks' plan check if this
        call made it: the state kept from the last step while the model holds the arrays it handed out, else
        (the first step, or a model changed from outside) a new one cut from the model."""
        if self.resident is not None and self.resident.holds(params_flat):
            return self.resident, None
        self.resident = ResidentFsdp(tree_unflatten(params_flat), self.optimizer, self.group,
                                     self.communication_size, self.layout, self.max_norm, reduce_scatter=self.transport)
        return self.resident, self.resident.rank_check_s

    def step(self, loss_fn: Callable, *batch: mx.array) -> tuple[mx.array, mx.array | None]:
        """One optimizer step over ``batch`` (this rank's part), split into G micro-batches.

        Args:
            loss_fn: ``loss_fn(model, *micro_batch) -> scalar`` mean loss.
            batch: Arrays whose axis 0 is this rank's batch (divisible by G).

        Returns:
            ``(loss, grad_norm)``: this rank's mean loss over the micro-batches, and the global
            norm of the averaged gradient before clipping (``None`` without ``max_norm``).
        """
        g, n, model = self.num_microbatches, self.group.size(), self.model
        micro_batches = split_microbatches(batch, g)
        per_micro = g > 1 and not self.defer_sync
        params = model.trainable_parameters()
        ddp = self.record.family == "data_parallel"
        if ddp:
            plan, checks = get_plan(tree_flatten(params), self.communication_size, n, self.layout), None
        else:  # the ranks check their plan as the resident state is first cut (once per plan)
            resident, checks = self._resident_state(tree_flatten(params))
            plan = resident.plan
        value_and_grad, scale = nn.value_and_grad(model, loss_fn), 1.0 / g
        if ddp:
            sync = (lambda gr: nn.average_gradients(gr, group=self.group, all_reduce_size=self.communication_size)) \
                if per_micro else None
            loss, acc, sync_s = accumulate_microbatches(value_and_grad, model, micro_batches, sync)
            self._phase("accumulated")
            t_acc = time.perf_counter()
            acc = tree_map(lambda a: a * scale, acc) if g > 1 else acc
            norm = None
            if not per_micro:
                res = ddp_apply_gradients(acc, params, self.optimizer, self.group, self.communication_size,
                                          max_norm=self.max_norm)
                new, norm = res if self.max_norm is not None else (res, None)
            else:
                if self.max_norm is not None:  # already averaged: the norm is local
                    clipped, norm = clip_by_global_norm(dict(tree_flatten(acc)), self.max_norm)
                    acc = tree_unflatten(list(clipped.items()))
                new = self.optimizer.apply_gradients(acc, params)
        elif per_micro:  # reduce-scatter every micro-batch, accumulate this rank's shards
            sync = lambda gr: shard_gradients(tree_flatten(gr), plan, self.group, None, self.transport)  # noqa: E731
            loss, acc, sync_s = accumulate_microbatches(value_and_grad, model, micro_batches, sync)
            self._phase("accumulated")
            t_acc = time.perf_counter()
            shards = {k: v * scale for k, v in acc.items()}
            del acc  # apply_shards releases each bucket's shard once gathered
            new, norm = resident.apply_shards(shards)
        else:  # deferred: accumulate full local gradients, then the resident FSDP step once
            loss, acc, sync_s = accumulate_microbatches(value_and_grad, model, micro_batches, None)
            self._phase("accumulated")
            t_acc = time.perf_counter()
            acc = tree_map(lambda a: a * scale, acc) if g > 1 else acc
            res = resident.step(acc)
            new, norm = res if self.max_norm is not None else (res, None)
        model.update(new)
        mx.eval(model.parameters(), self.optimizer.state, loss, *([norm] if norm is not None else []))
        b = plan.buckets.num_buckets if n > 1 else 0
        syncs, clip = (g if per_micro else 1), int(self.max_norm is not None and n > 1)
        fsdp = not ddp
        self.report = dict(strategy=self.record.name, num_microbatches=g, defer_sync=self.defer_sync,
                           num_buckets=plan.buckets.num_buckets, reduce_scatter_transport=self.transport if fsdp else None,
                           ring_transport=ring_transport(self.transport, n) if fsdp else None,
                           num_all_sums=clip if fsdp else syncs * b, num_reduce_scatters=syncs * b if fsdp else 0,
                           num_all_gathers=b if fsdp else 0, num_rank_checks=int(checks is not None),
                           sync_time_s=sync_s + time.perf_counter() - t_acc)
        self._phase("updated")
        return loss, norm


def make_trainer(model: nn.Module, optimizer: Any, group: mx.distributed.Group | None = None, *,
                 strategy: str = "ddp", num_microbatches: int = 1, defer_sync: bool = True,
                 communication_size: int = 32 * MiB, layout: str = "row", reduce_scatter: str = "auto",
                 max_norm: float | None = None) -> AccumTrainer:
    """A DDP or FSDP (no parameter sharding) training step with gradient accumulation.

    Args:
        model: The ``mlx.nn.Module`` (full parameters, identical on every rank).
        optimizer: An MLX optimizer; under FSDP its state covers this rank's 1/N shards.
        group: Default: the global group.
        strategy: A registered DDP or ZeRO-1/2-like strategy (``"ddp"``, ``"fsdp"``, ``"fsdp-row"``,
            ``"fsdp-flat"``: the last two fix ``layout``).
        num_microbatches: G, micro-batches per optimizer step (each rank's batch split along axis 0).
        defer_sync: With G > 1: accumulate local gradients and synchronise once per step (True,
            1 collective per bucket) or synchronise every micro-batch (False, G per bucket).
        communication_size: Bucket cap in bytes (MLX's rule). Default: 32 MiB.
        layout: FSDP shard layout, ``"row"`` or ``"flat"``.
        reduce_scatter: FSDP reduce-scatter transport, as in :func:`~workbench.adapters.mlx.fsdp.fsdp_apply_gradients`.
        max_norm: Clip the averaged gradient to this global norm, if given.

    Raises:
        ValueError: on an unknown strategy, layout or transport, or an invalid knob (named).
    """
    record = get_strategy(strategy)
    if record.family not in ("data_parallel", "zero_1_2"):
        raise ValueError(f"strategy {strategy!r} gathers units: make_trainer runs DDP and ZeRO-1/2-like strategies "
                         "(full sharding: make_zero3_trainer).")
    layout = record.layout or layout
    check_microbatches(num_microbatches, defer_sync, max_norm)
    if layout not in ("row", "flat"):
        raise ValueError(f"Unknown layout {layout!r}; choose 'row' or 'flat'.")
    if reduce_scatter not in REDUCE_SCATTER_TRANSPORTS:
        raise ValueError(f"Unknown reduce_scatter {reduce_scatter!r}; choose one of {', '.join(REDUCE_SCATTER_TRANSPORTS)}.")
    return AccumTrainer(model, optimizer, group or mx.distributed.init(), strategy=record,
                        num_microbatches=num_microbatches, defer_sync=defer_sync, communication_size=communication_size,
                        layout=layout, reduce_scatter=reduce_scatter, max_norm=max_norm)

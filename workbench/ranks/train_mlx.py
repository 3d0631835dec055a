"""One rank of an MLX training run: a small decoder LM (:mod:`workbench.models`) trained on
Markov-chain tokens (:mod:`workbench.models.data`), each rank on its slice of the global batch, so
every strategy computes the same global step. Every step is appended to the run store as it happens.
"""

from __future__ import annotations

import contextlib
import math
import os
import time

from workbench.ranks.probes import (
    COLLECTIVE_KEYS,
    can_split_groups,
    collective_count,
    package_versions,
    peak_array_bytes,
    peak_rss_bytes,
    tree_nbytes,
)
from workbench.runs.spec import RunSpec

#: Longest wait, in seconds, for the ``sum_scatter`` check before a ``fully_shard`` run (the ranks have just
#: agreed on the start, so they arrive together; a probe lost in MLX, #4285, ends the rank after this).
SUM_SCATTER_CHECK_S = 60.0


def train_mlx(spec: RunSpec, handle) -> dict:
    """Train one rank of ``spec`` (MLX), appending each step to ``handle``; returns the rank's report."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from workbench.adapters.mlx.accum import make_trainer
    from workbench.adapters.mlx.zero3_trainer import make_zero3_trainer
    from workbench.strategies import get_strategy
    from workbench.adapters.mlx.agree import check_ranks_agree
    from workbench.adapters.mlx.base import make_optimizer as make_mlx_optimizer
    from workbench.adapters.mlx.ring import init_ring
    from workbench.adapters.mlx.fsdp import optimizer_state_bytes
    from workbench.adapters.mlx.transport import has_sum_scatter
    from workbench.models.data import rank_slice
    from workbench.ranks.phases import PHASE_AGREE, PHASE_JOIN, PHASE_MODEL, PHASE_STEP, report_phase
    from workbench.ranks.user_model import (
        agree_on_start,
        block_units,
        check_finite_loss,
        global_batches,
        mlx_model_and_loss,
        start_fingerprint,
    )

    report_phase(handle, PHASE_JOIN)
    sum_scatter = None  # fully_shard only: check_sum_scatter's answer ("supplied", "native", "none needed")
    backend = os.environ.get("WORKBENCH_BACKEND", "ring") if spec.num_ranks > 1 else "none"
    if spec.num_ranks == 1:  # no peers, no backend: MLX's group of one (a ring of one waits for a peer)
        os.environ.pop("MLX_HOSTFILE", None)
        group = mx.distributed.init(strict=False)
    else:
        group = init_ring(backend)
    rank, size = group.rank(), group.size()
    report_phase(handle, PHASE_MODEL, rank)
    model, loss_fn = mlx_model_and_loss(spec)  # the built-in LM, or the user's factory (spec.model_factory)
    opt = make_mlx_optimizer(spec.optimizer, spec.learning_rate, weight_decay=spec.weight_decay)
    # Always ask for the norm (an infinite max_norm clips nothing) so every run records it.
    max_norm = spec.max_norm if spec.max_norm is not None else math.inf
    accum = dict(max_norm=max_norm, num_microbatches=spec.num_microbatches, defer_sync=spec.defer_sync)
    # Once, before the plan is first used: the plans, and a digest of the starting weights.
    fingerprint = start_fingerprint(spec, tree_flatten(model.parameters()), size, to_numpy=_numpy)
    report_phase(handle, PHASE_AGREE, rank)
    exchange_s = agree_on_start(lambda fp: check_ranks_agree(group, fp), fingerprint, spec, rank)
    record = get_strategy(spec.strategy, framework="mlx")
    with contextlib.ExitStack() as run_scope:  # what the run's trainer needs until its last step
        if record.family == "fully_shard":  # MLX's own fully_shard: every block, then the root
            trainer, sum_scatter = _fully_shard_trainer(record, model, opt, group, run_scope, accum)
        elif record.gathers_units:  # ZeRO-3: one unit per transformer block (as the plan counts them), plus the root
            trainer = make_zero3_trainer(model, opt, group, units=block_units(model),
                                         reshard_after_forward=record.reshard_after_forward, **accum)
        else:  # DDP, or MLX's FSDP step in the record's layout, its state resident in the buckets (ResidentFsdp)
            trainer = make_trainer(model, opt, group, strategy=record.name,
                                   communication_size=spec.communication_size, **accum)
        # The trainer evaluates every micro-batch's backward before its sync starts (deferred: before the
        # one sync of the step), so activations are gone before the collective buffers and update copies
        # appear (the phases of workbench.estimate.memory), and reports the seconds spent syncing. Full
        # sharding's collectives run inside forward and backward: its sync time is not separable (None).
        batch_for_step = global_batches(spec)  # Markov chain or spec.data's token file
        mx.reset_peak_memory()
        report_phase(handle, PHASE_STEP, rank)
        for step in range(spec.steps):
            local = rank_slice(batch_for_step(step), rank, size)
            inputs, targets = mx.array(local[:, :-1]), mx.array(local[:, 1:])
            t0 = time.perf_counter()
            loss, norm = trainer.step(loss_fn, inputs, targets)
            t1 = time.perf_counter()
            loss = loss.item()
            handle.append_steps([{
                "step": step, "rank": rank, "loss": loss, "grad_norm": norm.item(),
                "step_time_s": t1 - t0, "sync_time_s": trainer.report.get("sync_time_s"),
                "num_collectives": collective_count(trainer.report),
                "peak_rss_bytes": peak_rss_bytes(), "peak_array_bytes": peak_array_bytes(),
            }])
            check_finite_loss(loss, step, rank)  # after its row is stored: the record shows it
    report = trainer.report
    params = trainer.model.parameters()  # under fsdp-full and fully_shard: this rank's rows
    return {"rank": rank, "backend": backend,
            "capabilities": {"sum_scatter": has_sum_scatter(group), "group_split": can_split_groups(group)},
            "sum_scatter_check": sum_scatter,
            # fully_shard: the sum_scatter calls its backward made in the last step, counted by the shim
            "supplied_reduce_scatters": report.get("num_supplied_reduce_scatters"),
            "collective_path": report.get("reduce_scatter_transport") or "all_reduce",
            "ring_transport": report.get("ring_transport"), "peak_rss_bytes": peak_rss_bytes(),
            "fingerprint_exchange_s": exchange_s, "initial_weights_sha256": fingerprint["initial_weights"],
            "peak_array_bytes": peak_array_bytes(),
            "collectives": {kind: int(report.get(key, 0)) for kind, key in COLLECTIVE_KEYS.items()},
            "measured_memory": {"parameters": tree_nbytes(params),
                                "optimizer_state": optimizer_state_bytes(opt) + _master_shard_bytes(trainer, size),
                                "peak": peak_array_bytes(), "peak_source": "mx.get_peak_memory"},
            "versions": package_versions()}


def _fully_shard_trainer(record, model, opt, group, run_scope: contextlib.ExitStack, accum: dict):
    """The trainer of MLX's own ``fully_shard`` (the record's builder), and what the pre-run check found.

    The workbench's CPU reduce-scatter stands in for the ``sum_scatter`` ring and MPI lack, for the whole run
    (``run_scope``: until its last step, error or not); then every rank, the ranks having agreed on the start,
    reduce-scatters a known matrix the way ``fully_shard`` will: where the collective is still missing or
    wrong, every rank fails within :data:`SUM_SCATTER_CHECK_S`, naming ``sum_scatter`` and the backend
    (:func:`~workbench.adapters.mlx.fully_shard.check_sum_scatter`), instead of hanging in the first step.
    """
    import importlib

    from workbench.adapters.mlx.fully_shard import check_sum_scatter, supply_sum_scatter

    run_scope.enter_context(supply_sum_scatter(group))
    found = check_sum_scatter(group, timeout_s=SUM_SCATTER_CHECK_S)
    module, _, name = record.implementation("mlx").builder.partition(":")
    return getattr(importlib.import_module(module), name)(model, opt, group, **accum), found


def _master_shard_bytes(trainer, num_ranks: int) -> int:
    """Bytes of the master shards a resident FSDP trainer keeps for the run (the sharded state beside the optimizer's,
    as the memory model counts it: ``master_weights``); 0 for other trainers, and for a group of one, whose
    parameters are views of its shards."""
    resident = getattr(trainer, "resident", None)
    return int(sum(v.nbytes for v in resident.shards.values())) if resident is not None and num_ranks > 1 else 0


def _numpy(array):
    """An MLX array's values as NumPy (bfloat16, which NumPy lacks, as its uint16 bits)."""
    import mlx.core as mx
    import numpy as np

    return np.asarray(array.view(mx.uint16) if array.dtype == mx.bfloat16 else array)

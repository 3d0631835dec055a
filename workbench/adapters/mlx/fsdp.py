"""The real FSDP step in MLX: ``fsdp_apply_gradients`` on the workbench's bucket and shard plans.

mlx 0.32.4 no longer ships ``mlx.nn.fsdp_apply_gradients`` (0.31.1-0.32.0 only), so the
workbench provides it with the same signature and return contract, plus a ``layout``
choice. The step realises exactly the plan of :func:`workbench.core.buckets.plan_buckets` and
:func:`workbench.core.shards.plan_shards` (the one the notebooks draw):

1. per bucket, the ``(N, c)`` matrix whose row ``k`` holds the ``c`` elements rank ``k`` owns
   (:meth:`~workbench.core.shards.ShardPlan.rank_slices`): under ``row``, the k-th contiguous
   1/N of every gradient; under ``flat``, the k-th chunk of the flattened bucket, zero-padded.
   Each gradient is read once (:func:`~workbench.adapters.mlx.rows.bucket_matrix`);
2. reduce-scatter the rows (sum) and divide by the number of data-parallel ranks;
3. optionally clip by the global norm (local sum of squares, ``all_sum``, ``sqrt``);
4. update the local shards with the optimizer (its state covers 1/N of the model);
5. all-gather the updated shards and rebuild the full parameter tree.

Reduce-scatter paths: ``"sum_scatter"`` (NCCL, JACCL); ``"ring"``, built here from
``send``/``recv`` for the CPU backends (ring, MPI), which lack ``sum_scatter``: N - 1
steps, each rank sending ``(N - 1) / N`` of the bucket in all, the ideal; ``"all_sum"``,
an all-reduce then a slice: the right numbers at twice the traffic.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from workbench.adapters.mlx.agree import agree_on_step
from workbench.adapters.mlx.rows import (
    bucket_matrix,
    bucket_row,
    check_trees,
    get_plan,
    rebuild_arrays,
)
from workbench.adapters.mlx.transport import (
    REDUCE_SCATTER_TRANSPORTS,
    gather_bucket,
    reduce_scatter_bucket,
    resolve_transport,
)
from workbench.core.shards import ShardPlan
from workbench.core.units import MiB


def shard_gradients(
    grads_flat: list[tuple[str, mx.array]],
    plan: ShardPlan,
    group: mx.distributed.Group,
    dp_group: mx.distributed.Group | None = None,
    transport: str = "ring",
    stream: Any = None,
) -> dict[str, mx.array]:
    """Steps 1-2 of the FSDP step: this rank's shard of the averaged gradient, per bucket.

    Returns ``{str(bucket): 1-D shard}``, evaluated; the shard of bucket b holds exactly the
    elements ``plan.rank_slices(rank, b)`` names (plus trailing zero padding under ``flat``).
    """
    n = group.size()
    num_replicas = dp_group.size() if dp_group is not None else 1
    bp = plan.buckets
    shards = {}
    grads = [g for _, g in grads_flat]
    for b in range(bp.num_buckets):
        # Every row of the bucket at once, evaluated before the transport is posted: MLX's ring
        # backend polls its sockets without sleeping, so a receive posted while the gradient and
        # the rows are still computing takes a core from them (with 2 CPU cores and 4 ranks this
        # step took 970 ms with the rows lazy, 600 ms with them evaluated first, measured).
        matrix = bucket_matrix(grads, plan, b)
        mx.eval(matrix)
        shard = reduce_scatter_bucket(matrix, group, transport, stream)
        del matrix
        if num_replicas > 1:
            shard = mx.distributed.all_sum(shard, group=dp_group, stream=stream)
        shards[str(b)] = shard / (n * num_replicas)
        # Evaluate each bucket before the next: only one bucket's rows and receive buffers are
        # alive at a time (one lazy graph for all buckets held several buckets' buffers at
        # once: +4 x the parameter bytes at the peak with 4 MiB buckets on 2 ranks, measured).
        # Evaluated before anything consumes them, too: left lazy, Adam's update (which reads
        # each shard twice, for m and v) came out wrong on 2 ring ranks for buckets of several
        # arrays, deterministically (tests/test_mlx_fsdp.py caught it); a minimal repro without
        # the gradient graph did not show it, so the MLX-side cause is not pinned down.
        mx.eval(shards[str(b)])
    return shards


def check_step_knobs(max_norm: object, communication_size: object) -> None:
    """Refuse a ``max_norm`` that is not None or a number > 0 (0 applies no update, a negative one climbs,
    NaN poisons every parameter; ``inf`` reports the norm and clips nothing) and a ``communication_size`` that is not a whole number of
    bytes, naming the knob (issue 14, item 10)."""
    if max_norm is not None and (isinstance(max_norm, bool) or not isinstance(max_norm, numbers.Real)
                                 or math.isnan(max_norm) or max_norm <= 0):
        raise ValueError(f"max_norm must be None (no clipping) or a number > 0 (inf: report the norm, clip "
                         f"nothing), got {max_norm!r}.")
    if isinstance(communication_size, bool) or not isinstance(communication_size, numbers.Integral):
        raise ValueError(f"communication_size must be a whole number of bytes (e.g. 32 * MiB), got "
                         f"{communication_size!r}.")


def clip_by_global_norm(
    grads: dict[str, mx.array], max_norm: float, group: mx.distributed.Group | None = None, stream: Any = None
) -> tuple[dict[str, mx.array], mx.array]:
    """Scale gradients by ``min(max_norm / (norm + 1e-6), 1)``; returns (grads, norm).

    With a ``group`` the gradients are shards and the norm is over the whole group (local
    sums of squares in fp32, ``all_sum``, ``sqrt``); without one they are whole and the norm
    is local. This is the norm MLX's ``clip_grad_norm`` computes on full gradients;
    as MLX's ``clip_grad_norm`` computes it on full gradients; the scale is cast to each
    gradient's dtype so bf16 gradients stay bf16 (MLX's own helper promotes them to fp32).
    """
    local_sq = sum((g.astype(mx.float32) ** 2).sum() for g in grads.values())
    total = mx.distributed.all_sum(local_sq, group=group, stream=stream) if group is not None and group.size() > 1 else local_sq
    norm = mx.sqrt(total)
    scale = mx.minimum(max_norm / (norm + 1e-6), 1.0)
    return {k: g * scale.astype(g.dtype) for k, g in grads.items()}, norm


def ddp_apply_gradients(
    gradients: Any,
    parameters: Any,
    optimizer: Any,
    group: mx.distributed.Group | None = None,
    communication_size: int = 32 * MiB,
    max_norm: float | None = None,
):
    """The DDP baseline: ``mlx.nn.average_gradients``, optional clipping, a full optimizer update.

    Same return contract as :func:`fsdp_apply_gradients`.
    """
    import mlx.nn as nn

    group = group or mx.distributed.init()
    check_step_knobs(max_norm, communication_size)
    grads = nn.average_gradients(gradients, group=group, all_reduce_size=communication_size)
    norm = None
    if max_norm is not None:
        flat, norm = clip_by_global_norm(dict(tree_flatten(grads)), max_norm)
        grads = tree_unflatten(list(flat.items()))
    updated = optimizer.apply_gradients(grads, parameters)
    return updated if max_norm is None else (updated, norm)


def _split_group_error(fsdp: mx.distributed.Group, dp: mx.distributed.Group) -> None:
    world = mx.distributed.init()
    if fsdp.size() * dp.size() != world.size():
        raise ValueError(
            f"HSDP needs fsdp_group.size() * dp_group.size() == world size, got {fsdp.size()} * {dp.size()} != {world.size()}."
        )


def fsdp_apply_gradients(
    gradients: Any,
    parameters: Any,
    optimizer: Any,
    fsdp_group: mx.distributed.Group | None = None,
    dp_group: mx.distributed.Group | None = None,
    communication_size: int = 32 * MiB,
    communication_stream: Any = None,
    max_norm: float | None = None,
    layout: str = "row",
    *,
    reduce_scatter: str = "auto",
    report: dict | None = None,
):
    """Distributed optimizer step with gradients and optimizer state sharded across ranks.

    Same contract as ``mlx.nn.fsdp_apply_gradients`` (mlx 0.31-0.32.0): similar to PyTorch
    FSDP with ``reshard_after_forward=False`` (parameters stay whole between steps).

    Args:
        gradients: Tree of full gradients, same structure, shapes and dtypes as ``parameters``.
        parameters: Tree of full parameters (identical on every rank).
        optimizer: An MLX optimizer (``apply_gradients``); its state is created for the local
            shards only, keyed by bucket, so it holds 1/N of DDP's.
        fsdp_group: Group to shard over. Default: the global group.
        dp_group: Group of replicas to average the shards over (HSDP: shard inside a node,
            replicate across nodes). Needs a backend that can split groups (NCCL, MPI).
        communication_size: Bucket cap in bytes (MLX's rule; ``<= 0``: one bucket per array).
            Default: 32 MiB.
        communication_stream: Stream for the collectives. Default: the backend's.
        max_norm: Clip to this global gradient norm before the update, if given.
        layout: ``"row"`` (each array reshaped ``(N, -1)``; N must divide every array's size) or
            ``"flat"`` (each bucket cut into N equal chunks, padded).
        reduce_scatter: ``"auto"`` (``sum_scatter`` where the backend has it, else ``"ring"``),
            ``"sum_scatter"``, ``"ring"`` (the workbench's ring: send/recv, or at two ranks one
            all_gather exchange), ``"send_recv"`` (that ring over send/recv at any N) or ``"all_sum"``.
        report: If a dict is given, it is filled with what the step did: the reduce-scatter
            transport, collectives per kind, buckets, and bytes sent per rank.

    Returns:
        The updated full-parameter tree, of the same kind as ``parameters`` (an empty tree comes
        back empty); ``(parameters, grad_norm)`` when ``max_norm`` is given, ``grad_norm`` being the
        global norm of the averaged gradient before clipping. The norm is accumulated in float32
        whatever the gradients' dtype (MLX's own helper computes it in the gradients' dtype, which
        for bf16 gradients loses digits); the clipping scale is cast back to each gradient's dtype.

    Raises:
        ValueError: mismatched trees (naming the path), a ``row`` array not divisible by N
            (naming path and shape), an unknown option, or an HSDP shape that does not
            multiply to the world size.
        RanksDisagree: (a ``ValueError``) on every rank, before the first collective of a plan, when
            the ranks' parameter paths, shapes, dtypes, layout, ``communication_size``, clipping
            or transport differ; it names the first differing field and the ranks involved.
    """
    if layout not in ("row", "flat"):
        raise ValueError(f"Unknown layout {layout!r}; fsdp_apply_gradients supports 'row' and 'flat'.")
    check_step_knobs(max_norm, communication_size)
    if reduce_scatter not in REDUCE_SCATTER_TRANSPORTS:
        raise ValueError(f"Unknown reduce_scatter {reduce_scatter!r}; choose one of {', '.join(REDUCE_SCATTER_TRANSPORTS)}.")
    fsdp = fsdp_group or mx.distributed.init()
    n = fsdp.size()
    if dp_group is not None:
        _split_group_error(fsdp, dp_group)
    num_replicas = dp_group.size() if dp_group is not None else 1

    params_flat = tree_flatten(parameters)
    grads_flat = tree_flatten(gradients)
    check_trees(grads_flat, params_flat)
    if not params_flat:  # nothing to shard or update; tree_unflatten([]) would turn {} into []
        empty = type(parameters)() if isinstance(parameters, (dict, list, tuple)) else parameters
        return empty if max_norm is None else (empty, mx.array(0.0, dtype=mx.float32))
    plan = get_plan(params_flat, communication_size, n, layout)
    bp = plan.buckets
    transport = resolve_transport(fsdp, reduce_scatter)
    # Before this plan is first used, every rank checks the others built the same one (issue 14,
    # item 9): a differing parameter, shape, bucket cap or clipping setting otherwise hangs or
    # silently averages wrong data. Once per plan; later steps pay a dictionary lookup.
    check_s = agree_on_step(fsdp, plan, params_flat, layout=layout, communication_size=communication_size,
                            max_norm=max_norm, transport=transport, replicas=num_replicas)

    grad_shards = shard_gradients(grads_flat, plan, fsdp, dp_group, transport, communication_stream)
    del grads_flat
    updated, grad_norm = apply_gradient_shards(grad_shards, params_flat, plan, optimizer, fsdp, max_norm,
                                               communication_stream)

    if report is not None:
        shard_bytes = int(sum(int(plan.bucket_chunk_elems[b]) * int(bp.bucket_itemsize[b]) for b in range(bp.num_buckets)))
        rs_bytes = {"ring": (n - 1) * shard_bytes, "send_recv": (n - 1) * shard_bytes,
                    "sum_scatter": (n - 1) * shard_bytes, "all_sum": 2 * (n - 1) * shard_bytes}
        report.update(
            reduce_scatter_transport=transport if n > 1 else "none",
            ring_transport=(("all_gather exchange" if n == 2 and transport == "ring" else "send/recv")
                            if transport in ("ring", "send_recv") and n > 1 else None),
            num_buckets=bp.num_buckets,
            num_reduce_scatters=bp.num_buckets if n > 1 else 0,
            num_all_gathers=bp.num_buckets if n > 1 else 0,
            num_all_sums=(1 if (max_norm is not None and n > 1) else 0) + (bp.num_buckets if num_replicas > 1 else 0),
            reduce_scatter_bytes_sent=rs_bytes[transport] if n > 1 else 0,
            all_gather_bytes_sent=(n - 1) * shard_bytes,
            layout=layout,
            num_shards=n,
            num_rank_checks=int(check_s is not None),  # one all_gather of a few int32s, first step only
            rank_check_s=check_s,
        )
    result = tree_unflatten(updated)
    return result if max_norm is None else (result, grad_norm)


def apply_gradient_shards(grad_shards: dict[str, mx.array], params_flat: list[tuple[str, mx.array]], plan: ShardPlan,
                          optimizer: Any, group: mx.distributed.Group, max_norm: float | None = None,
                          stream: Any = None) -> tuple[list[tuple[str, mx.array]], mx.array | None]:
    """Steps 3-5 of the FSDP step on reduced shards: clip by the global norm (if ``max_norm``), the
    optimizer on this rank's 1/N, all-gather bucket by bucket.

    ``grad_shards`` (``{str(bucket): 1-D shard}``, as :func:`shard_gradients` returns) is
    emptied as buckets are gathered: hold no other reference to its shards, or they stay alive.

    Returns:
        ``(updated params_flat, grad_norm)`` (``grad_norm`` is ``None`` without ``max_norm``).
    """
    bp, rank = plan.buckets, group.rank()
    params = [p for _, p in params_flat]
    param_shards = {str(b): bucket_row(params, plan, rank, b) for b in range(bp.num_buckets)}
    grad_norm = None
    if max_norm is not None:
        clipped, grad_norm = clip_by_global_norm(grad_shards, max_norm, group, stream)
        grad_shards.clear()
        grad_shards.update(clipped)
        del clipped
    # A copy: an optimizer may hand back one of its input dicts (a no-op update returns the
    # parameters, a custom one the gradients), and the loop below pops from both.
    new_shards = dict(optimizer.apply_gradients(grad_shards, param_shards))
    updated = list(params_flat)
    del param_shards
    for b in range(bp.num_buckets):
        # One bucket at a time, its gradient shard and new shard released once gathered: the
        # step's transient is the new parameter tree plus about one bucket (estimate_memory's
        # update_copy and bucket rows), not every bucket's shards and buffers at once.
        # The bucket's update is evaluated before its all-gather is posted: MLX's ring backend
        # polls its sockets without sleeping, so a collective waiting on a graph still computing
        # takes a core from it (see shard_gradients).
        mx.eval(new_shards[str(b)])
        grad_shards.pop(str(b))
        gathered = gather_bucket(new_shards.pop(str(b)), group, stream)
        rebuilt = rebuild_arrays(gathered, params, plan, b)
        mx.eval(rebuilt)
        for i, arr in zip(bp.bucket(b).tolist(), rebuilt):
            updated[i] = (params_flat[i][0], arr)
    return updated, grad_norm


def optimizer_state_bytes(optimizer: Any) -> int:
    """Bytes of every array in the optimizer's state (measured from the arrays)."""
    return int(sum(v.nbytes for _, v in tree_flatten(optimizer.state) if isinstance(v, mx.array)))

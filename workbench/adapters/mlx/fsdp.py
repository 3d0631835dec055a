"""The real FSDP step in MLX: ``fsdp_apply_gradients`` on the workbench's bucket and shard plans.

mlx 0.32.4 no longer ships ``mlx.nn.fsdp_apply_gradients`` (0.31.1-0.32.0 only), so the
workbench provides it with the same signature and return contract, plus a ``layout``
choice. The step realises exactly the plan of :func:`workbench.core.buckets.plan_buckets` and
:func:`workbench.core.shards.plan_shards` (the one the notebooks draw):

1. per bucket, row ``k`` (the ``c`` elements rank ``k`` owns) is built from the plan's
   :meth:`~workbench.core.shards.ShardPlan.rank_slices`: under ``row``, the k-th contiguous 1/N
   of every gradient; under ``flat``, the k-th chunk of the flattened bucket, zero-padded.
   Only the rows a collective needs are materialised (MLX's CPU allocator makes every
   large fresh buffer cost page faults);
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

import functools
import os
import weakref
from collections import OrderedDict
from typing import Any, Callable

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from workbench.adapters.mlx.base import spec_from_mlx
from workbench.core.buckets import plan_buckets
from workbench.core.shards import ShardPlan, plan_shards
from workbench.core.units import MiB

REDUCE_SCATTER_PATHS = ("auto", "sum_scatter", "ring", "send_recv", "all_sum")
_SUM_SCATTER_SUPPORT: list[bool] = []  # one process, one backend: probed once
#: Plans kept for reuse (a training loop asks for the same few every step), and rows' pieces.
PLAN_CACHE_SIZE = 64
PIECE_CACHE_SIZE = 4096


def has_sum_scatter(group: mx.distributed.Group) -> bool:
    """Whether the process's backend implements ``sum_scatter`` (probed once per process).

    A process runs one backend, so the answer holds for all its groups (``init()`` returns
    a new ``Group`` object on every call, so groups make poor cache keys). Ring and MPI
    raise before any byte is sent ("[ring] sum_scatter not supported."), on every rank
    alike, so the probe is safe to run collectively.
    """
    if not _SUM_SCATTER_SUPPORT:
        try:
            mx.eval(mx.distributed.sum_scatter(mx.zeros((group.size(),)), group=group))
            _SUM_SCATTER_SUPPORT.append(True)
        except RuntimeError:
            _SUM_SCATTER_SUPPORT.append(False)
    return _SUM_SCATTER_SUPPORT[0]


def make_hsdp_groups(fsdp_size: int, world: mx.distributed.Group | None = None):
    """Split the world into ``(fsdp_group, dp_group)``: shard within blocks of ``fsdp_size`` ranks.

    Rank r shards with ranks ``r // fsdp_size * fsdp_size ...`` and replicates with the
    ranks holding the same shard index in the other blocks.

    Raises:
        ValueError: if ``fsdp_size`` does not divide the world size.
        RuntimeError: if the backend cannot split groups (ring), naming it.
    """
    world = world or mx.distributed.init()
    n, r = world.size(), world.rank()
    if isinstance(fsdp_size, bool) or not isinstance(fsdp_size, int) or fsdp_size < 1 or n % fsdp_size:
        raise ValueError(f"fsdp_size must be a positive divisor of the world size {n}, got {fsdp_size!r}.")
    try:
        fsdp = world.split(r // fsdp_size, r % fsdp_size)
        dp = world.split(r % fsdp_size, r // fsdp_size)
    except RuntimeError as err:
        backend = os.environ.get("WORKBENCH_BACKEND", "this")
        raise RuntimeError(
            f"HSDP needs Group.split, which the {backend} backend does not support ({err}). "
            "Use the NCCL or MPI backend for HSDP, or JAX's 2-D mesh."
        ) from err
    return fsdp, dp


@functools.lru_cache(maxsize=1)
def _ring_streams() -> tuple:
    """Two streams of the default device: sends on one, receives on the other (made once)."""
    device = mx.default_device()
    return mx.new_stream(device), mx.new_stream(device)


def ring_reduce_scatter(row: Callable[[int], mx.array], group: mx.distributed.Group, stream: Any = None, *,
                        exchange_at_two: bool = True) -> mx.array:
    """Sum a bucket over the group; return this rank's row of the sum.

    ``row(k)`` gives this rank's local row k of the bucket (1-D, the elements rank k owns),
    so only the rows being sent are ever materialised. A ring of N - 1 steps: at step k
    rank r sends its partial sum of row ``r - k - 1`` to rank r + 1 and adds the partial sum
    of row ``r - k - 2`` received from rank r - 1, so each rank sends ``(N - 1) * c``
    elements in all, the ideal. The ring backend's ``send`` waits for the matching ``recv``:
    with both on one stream every rank would wait in its send, so sends and receives go on
    two streams and each hop runs both directions at once. With two ranks the one hop is an
    ``all_gather`` of the row the other rank owns (same bytes, MLX's faster transport).
    ``stream`` (the caller's communication stream) carries the sends when given. The result
    is lazy, like every MLX collective. ``exchange_at_two=False`` keeps send/recv at two ranks.
    """
    n, r = group.size(), group.rank()
    if n == 1:
        return row(0)
    if n == 2 and exchange_at_two:
        # Two ranks: the ring is one exchange of the row the other rank owns. MLX's
        # all_gather moves it ~4x faster than send/recv on the ring backend (12.8 vs 53 ms
        # for 16 MiB here), for the same (N - 1) / N of the bucket per rank.
        theirs = mx.distributed.all_gather(row(1 - r), group=group, stream=stream)
        return row(r) + theirs.reshape(2, -1)[1 - r]
    send_stream, recv_stream = _ring_streams()
    send_stream = stream or send_stream
    right, left = (r + 1) % n, (r - 1) % n
    acc = row((r - 1) % n)
    for k in range(n - 1):
        sent = mx.distributed.send(acc, right, group=group, stream=send_stream)
        got = mx.distributed.recv_like(acc, left, group=group, stream=recv_stream)
        acc = row((r - k - 2) % n) + mx.depends(got, sent)
    return acc


def _reduce_scatter(row: Callable[[int], mx.array], group: mx.distributed.Group, path: str, stream: Any) -> mx.array:
    n = group.size()
    if n == 1:
        return row(0)
    if path in ("ring", "send_recv"):
        return ring_reduce_scatter(row, group, stream, exchange_at_two=path == "ring")
    matrix = mx.stack([row(k) for k in range(n)])
    if path == "sum_scatter":
        return mx.distributed.sum_scatter(matrix, group=group, stream=stream)[0]
    return mx.distributed.all_sum(matrix, group=group, stream=stream)[group.rank()]


def _all_gather(shard: mx.array, group: mx.distributed.Group, stream: Any) -> mx.array:
    """``(N * c,)``: every rank's shard, in rank order."""
    if group.size() == 1:
        return shard
    return mx.distributed.all_gather(shard, group=group, stream=stream)


def get_plan(parameters_flat: list[tuple[str, mx.array]], communication_size: int, num_shards: int, layout: str) -> ShardPlan:
    """The core's shard plan for these parameters (cached: planning is pure)."""
    spec = spec_from_mlx(tree_unflatten(list(parameters_flat)), name="mlx-params")
    return _plan(spec, int(communication_size), int(num_shards), layout)


@functools.lru_cache(maxsize=PLAN_CACHE_SIZE)
def _plan(spec, communication_size: int, num_shards: int, layout: str) -> ShardPlan:
    return plan_shards(plan_buckets(spec, communication_size), num_shards, layout)


def clear_caches() -> None:
    """Forget cached plans, rows' pieces and ring streams (all bounded; tests start clean with this)."""
    _plan.cache_clear()
    _PIECES.clear()
    _ring_streams.cache_clear()


def _check_trees(grads: list, params: list) -> None:
    gkeys, pkeys = [k for k, _ in grads], [k for k, _ in params]
    if gkeys != pkeys:
        missing = [k for k in pkeys if k not in set(gkeys)]
        extra = [k for k in gkeys if k not in set(pkeys)]
        raise ValueError(
            "The gradient tree must have the same structure as the parameters: "
            f"parameters without a gradient {missing[:5]}, gradients without a parameter {extra[:5]}"
            + ("" if missing or extra else " (same keys in a different order)") + "."
        )
    for (k, g), (_, p) in zip(grads, params):
        if g.shape != p.shape:
            raise ValueError(f"Gradient '{k}' has shape {tuple(g.shape)} but parameter '{k}' has shape {tuple(p.shape)}.")
        if g.dtype != p.dtype:
            raise ValueError(f"Gradient '{k}' is {g.dtype} but parameter '{k}' is {p.dtype}; dtypes are never promoted.")


_PIECES: OrderedDict[tuple[int, int, int], tuple[weakref.ref, list[tuple[int, int, int]], int]] = OrderedDict()


def _row_pieces(plan: ShardPlan, rank: int, bucket: int) -> tuple[list[tuple[int, int, int]], int]:
    """``([(param_index, start, stop), ...], padding)`` of rank ``rank`` in ``bucket``, from the plan.

    Cached by ``id(plan)`` with a weak reference to the plan, so an id reused by a later
    plan after the first was collected is never served the old pieces.
    """
    key = (id(plan), rank, bucket)
    cached = _PIECES.get(key)
    if cached is None or cached[0]() is not plan:
        index = {p.path: i for i, p in enumerate(plan.buckets.spec.params)}
        pieces = [(index[s.path], s.start, s.stop) for s in plan.rank_slices(rank, bucket)]
        padding = int(plan.bucket_chunk_elems[bucket]) - sum(stop - start for _, start, stop in pieces)
        cached = _PIECES[key] = (weakref.ref(plan), pieces, padding)
        while len(_PIECES) > PIECE_CACHE_SIZE:  # least recently used first
            _PIECES.popitem(last=False)
    _PIECES.move_to_end(key)
    return cached[1], cached[2]


def bucket_row(arrays: list[mx.array], plan: ShardPlan, rank: int, bucket: int) -> mx.array:
    """Rank ``rank``'s row of ``bucket`` (the elements the plan gives it, then zero padding), 1-D.

    ``arrays`` are all of the model's arrays by parameter index (gradients or parameters).
    Built from :meth:`~workbench.core.shards.ShardPlan.rank_slices`, so it is the plan by
    construction; only 1/N of the bucket is copied.
    """
    pieces, padding = _row_pieces(plan, rank, bucket)
    parts = [arrays[i].reshape(-1)[start:stop] for i, start, stop in pieces]
    if padding:
        parts.append(mx.zeros((padding,), dtype=arrays[pieces[0][0]].dtype if pieces else arrays[0].dtype))
    return parts[0] if len(parts) == 1 else mx.concatenate(parts)


def _rebuild(gathered: mx.array, params: list[mx.array], plan: ShardPlan, bucket: int) -> list[mx.array]:
    """Split an all-gathered bucket (``(N * c,)``) back into the bucket's arrays."""
    idx = plan.buckets.bucket(bucket).tolist()
    n = plan.num_shards
    if plan.layout == "flat" or len(idx) == 1:  # rows of a lone array are its contiguous 1/N pieces
        out, offset = [], 0
        for i in idx:
            size = params[i].size
            out.append(gathered[offset : offset + size].reshape(params[i].shape))
            offset += size
        return out
    matrix, out, col = gathered.reshape(n, -1), [], 0
    for i in idx:
        width = params[i].size // n
        out.append(matrix[:, col : col + width].reshape(params[i].shape))
        col += width
    return out


def shard_gradients(
    grads_flat: list[tuple[str, mx.array]],
    plan: ShardPlan,
    group: mx.distributed.Group,
    dp_group: mx.distributed.Group | None = None,
    path: str = "ring",
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
        shard = _reduce_scatter(lambda k, b=b: bucket_row(grads, plan, k, b), group, path, stream)
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
            path, collectives per kind, buckets, and bytes sent per rank.

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
    """
    if layout not in ("row", "flat"):
        raise ValueError(f"Unknown layout {layout!r}; fsdp_apply_gradients supports 'row' and 'flat'.")
    if reduce_scatter not in REDUCE_SCATTER_PATHS:
        raise ValueError(f"Unknown reduce_scatter {reduce_scatter!r}; choose one of {', '.join(REDUCE_SCATTER_PATHS)}.")
    fsdp = fsdp_group or mx.distributed.init()
    n = fsdp.size()
    if dp_group is not None:
        _split_group_error(fsdp, dp_group)
    num_replicas = dp_group.size() if dp_group is not None else 1

    params_flat = tree_flatten(parameters)
    grads_flat = tree_flatten(gradients)
    _check_trees(grads_flat, params_flat)
    if not params_flat:  # nothing to shard or update; tree_unflatten([]) would turn {} into []
        empty = type(parameters)() if isinstance(parameters, (dict, list, tuple)) else parameters
        return empty if max_norm is None else (empty, mx.array(0.0, dtype=mx.float32))
    plan = get_plan(params_flat, communication_size, n, layout)
    bp = plan.buckets
    path = reduce_scatter
    if path == "auto":
        path = "sum_scatter" if n > 1 and has_sum_scatter(fsdp) else "ring"

    grad_shards = shard_gradients(grads_flat, plan, fsdp, dp_group, path, communication_stream)
    del grads_flat
    updated, grad_norm = apply_gradient_shards(grad_shards, params_flat, plan, optimizer, fsdp, max_norm,
                                               communication_stream)

    if report is not None:
        shard_bytes = int(sum(int(plan.bucket_chunk_elems[b]) * int(bp.bucket_itemsize[b]) for b in range(bp.num_buckets)))
        rs_bytes = {"ring": (n - 1) * shard_bytes, "send_recv": (n - 1) * shard_bytes,
                    "sum_scatter": (n - 1) * shard_bytes, "all_sum": 2 * (n - 1) * shard_bytes}
        report.update(
            reduce_scatter_path=path if n > 1 else "none",
            ring_transport=(("all_gather exchange" if n == 2 and path == "ring" else "send/recv")
                            if path in ("ring", "send_recv") and n > 1 else None),
            num_buckets=bp.num_buckets,
            num_reduce_scatters=bp.num_buckets if n > 1 else 0,
            num_all_gathers=bp.num_buckets if n > 1 else 0,
            num_all_sums=(1 if (max_norm is not None and n > 1) else 0) + (bp.num_buckets if num_replicas > 1 else 0),
            reduce_scatter_bytes_sent=rs_bytes[path] if n > 1 else 0,
            all_gather_bytes_sent=(n - 1) * shard_bytes,
            layout=layout,
            num_shards=n,
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
        gathered = _all_gather(new_shards.pop(str(b)), group, stream)
        grad_shards.pop(str(b))
        rebuilt = _rebuild(gathered, params, plan, b)
        mx.eval(rebuilt)
        for i, arr in zip(bp.bucket(b).tolist(), rebuilt):
            updated[i] = (params_flat[i][0], arr)
    return updated, grad_norm


def optimizer_state_bytes(optimizer: Any) -> int:
    """Bytes of every array in the optimizer's state (measured from the arrays)."""
    return int(sum(v.nbytes for _, v in tree_flatten(optimizer.state) if isinstance(v, mx.array)))

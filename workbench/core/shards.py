"""Shard planning: which rank owns which elements of which gradient bucket.

Layouts (one reduce-scatter and one all-gather per bucket for ``row`` and ``flat``):

* ``"row"`` -- MLX PR #3130's final algorithm, and PyTorch FSDP2's per-parameter
  dim-0 sharding: every array of a bucket is reshaped ``(N, -1)`` and the bucket
  is concatenated on axis 1, so rank ``r`` owns the ``r``-th contiguous ``1/N`` of
  *every* array. Needs ``size % N == 0`` (``pad_rows=True`` pads each array up to
  a multiple of N instead, as FSDP2 does for uneven dim 0).
* ``"flat"`` -- DeepSpeed ZeRO-1/2 and FSDP1: the bucket is flattened, padded up
  to a multiple of N, and cut into N equal chunks; an array may straddle ranks.
* ``"greedy"`` -- PyTorch ``ZeroRedundancyOptimizer``: whole arrays, largest
  first, to the least-loaded rank. Gradients still travel as DDP all-reduces
  (one per bucket); each rank then broadcasts its updated arrays (one broadcast
  per owning rank, ``parameters_as_bucket_view=True``).

Plans are compact: a 1024-rank row plan of Llama-3-70B has about 740,000 slices,
so metrics are computed from sizes in O(#arrays + #buckets + N) and slices are
produced on demand per rank (:meth:`~workbench.core.shard_plan.ShardPlan.rank_slices`). The plan itself is
:class:`~workbench.core.shard_plan.ShardPlan`; each layout has its planner here.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from workbench.core.buckets import BucketPlan
from workbench.core.checks import MAX_NUM_SHARDS, integer
from workbench.core.shard_plan import ShardPlan, ShardSlice  # noqa: F401  (the plan's record, imported from here)

LAYOUTS = ("row", "flat", "greedy")


@dataclass(frozen=True)
class _ChunkLoads:
    owned_bytes: np.ndarray  # (N,) real bytes per rank
    alloc_bytes: np.ndarray  # (N,) allocated bytes per rank (real + padding)
    nonempty: np.ndarray  # (N,) segments of which the rank owns at least one real element
    num_chunks: np.ndarray  # (S,) ranks that own real elements of each segment


def _chunk_loads(lengths: np.ndarray, itemsizes: np.ndarray, chunks: np.ndarray, n: int) -> _ChunkLoads:
    """Loads when each segment of ``lengths`` elements is cut into N chunks of ``chunks`` elements.

    Rank r holds ``clip(L - r*c, 0, c)`` real elements of a segment and allocates ``c``.
    Computed with difference arrays, never materialising (segment, rank) pairs.
    """
    full = lengths // chunks  # ranks with a full chunk of real data
    rem = lengths - full * chunks  # real elements of the partial chunk (at rank `full`)
    has_rem = rem > 0
    num_chunks = full + has_rem
    diff = np.zeros(n + 1, np.int64)
    diff[0] += int((chunks * itemsizes).sum())
    np.add.at(diff, full, -chunks * itemsizes)
    owned = np.cumsum(diff)[:n]
    np.add.at(owned, full[has_rem], (rem * itemsizes)[has_rem])
    count = np.zeros(n + 1, np.int64)
    count[0] = len(lengths)
    np.add.at(count, num_chunks, -1)
    nonempty = np.cumsum(count)[:n]
    alloc = np.full(n, int((chunks * itemsizes).sum()), np.int64)
    return _ChunkLoads(owned, alloc, nonempty, num_chunks)


def _check_row(bp: BucketPlan, n: int, pad_rows: bool, require_axis0: bool) -> None:
    spec = bp.spec
    if not require_axis0 and (pad_rows or not (spec.sizes % n).any()) and all(p.shape for p in spec.params):
        return  # fast path; the loop below only runs to name the parameter at fault
    for p in spec.params:
        if not p.shape:
            raise ValueError(f"Parameter '{p.path}' is a scalar (shape ()); the row layout cannot reshape it to ({n}, -1).")
        if require_axis0 and p.shape[0] % n:
            raise ValueError(
                f"Cannot shard parameter '{p.path}' with shape {p.shape} across {n} ranks: axis 0 must be divisible by {n}."
            )
        if not pad_rows and p.size % n:
            raise ValueError(
                f"Cannot shard parameter '{p.path}' with shape {p.shape} ({p.size} elements) into {n} rows: "
                f"its size must be divisible by {n} (use layout='flat', or pad_rows=True)."
            )


def _greedy_owners(sizes_bytes: np.ndarray, n: int) -> np.ndarray:
    """ZeroRedundancyOptimizer's partition: largest first, to the least-loaded rank (ties: lowest rank)."""
    owners = np.empty(len(sizes_bytes), np.int64)
    heap = [(0, r) for r in range(n)]
    for i in np.argsort(-sizes_bytes, kind="stable"):
        load, r = heapq.heappop(heap)
        owners[i] = r
        heapq.heappush(heap, (load + int(sizes_bytes[i]), r))
    return owners


def plan_shards(
    bucket_plan: BucketPlan,
    num_shards: int,
    layout: str = "row",
    *,
    pad_rows: bool = False,
    require_axis0: bool = False,
) -> ShardPlan:
    """Assign every element of every bucket to one of ``num_shards`` ranks.

    Args:
        bucket_plan: From :func:`workbench.core.buckets.plan_buckets`.
        num_shards: N >= 1.
        layout: ``"row"``, ``"flat"`` or ``"greedy"`` (see the module docstring).
        pad_rows: ``row`` only: pad arrays whose size is not a multiple of N.
        require_axis0: ``row`` only: demand ``shape[0] % N == 0`` as MLX's
            ``fully_shard`` does, not only ``size % N == 0``.

    Raises:
        ValueError: on ``num_shards`` not an integer in 1..MAX_NUM_SHARDS (2**20; the plan's per-rank
            arrays bound its memory), an unknown layout, a ``bucket_plan`` that is not one, or (``row``) a scalar
            or an indivisible array, naming its path and shape.
    """
    if not isinstance(bucket_plan, BucketPlan):
        raise ValueError(f"bucket_plan must be a BucketPlan, got {type(bucket_plan).__name__}; "
                         f"build one with plan_buckets(model_spec, communication_size).")
    n = integer("num_shards", num_shards, low=1, high=MAX_NUM_SHARDS)  # plans allocate per-rank arrays
    if layout not in LAYOUTS:
        raise ValueError(f"Unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}.")
    return _PLANNERS[layout](bucket_plan, n, pad_rows=pad_rows, require_axis0=require_axis0)


def _plan_row(bp: BucketPlan, n: int, *, pad_rows: bool, require_axis0: bool) -> ShardPlan:
    """Each array cut into N equal rows (padded where ``pad_rows``); a bucket's shard is its arrays' rows."""
    _check_row(bp, n, pad_rows, require_axis0)
    sizes, isz, num_b = bp.spec.sizes, bp.spec.itemsizes, bp.num_buckets
    chunks = -(-sizes // n)
    loads = _chunk_loads(sizes, isz, chunks, n)
    bucket_chunk = np.add.reduceat(chunks[bp.order], bp.offsets[:-1]) if num_b else np.zeros(0, np.int64)
    return ShardPlan(
        bp, n, "row", pad_rows,
        rank_owned_bytes=loads.owned_bytes,
        rank_padding_bytes=loads.alloc_bytes - loads.owned_bytes,
        rank_fragments=loads.nonempty,
        num_split_arrays=int((loads.num_chunks > 1).sum()),
        num_reduce_scatters=num_b, num_all_gathers=num_b, num_all_reduces=0, num_broadcasts=0,
        param_chunk_elems=chunks, param_owner=np.zeros(len(bp.spec), np.int64), bucket_chunk_elems=bucket_chunk,
    )


def _plan_flat(bp: BucketPlan, n: int, **_) -> ShardPlan:
    """Each bucket cut flat into N equal chunks (the last padded); arrays may straddle two ranks."""
    sizes, num_b = bp.spec.sizes, bp.num_buckets
    total = bp.bucket_elems
    chunks = -(-total // n)
    loads = _chunk_loads(total, bp.bucket_itemsize, chunks, n)
    # A parameter boundary strictly inside a chunk adds a fragment to that chunk's rank.
    order_sizes = sizes[bp.order]
    csum = np.cumsum(order_sizes) - order_sizes
    bucket = np.repeat(np.arange(num_b), np.diff(bp.offsets))
    poff = csum - csum[bp.offsets[:-1]][bucket]
    c = chunks[bucket]
    inner = (poff > 0) & (poff % c != 0)
    frags = loads.nonempty.copy()
    np.add.at(frags, (poff // c)[inner], 1)
    split = (poff // c) != ((poff + order_sizes - 1) // c)
    none = np.zeros(len(bp.spec), np.int64)
    return ShardPlan(
        bp, n, "flat", False,
        rank_owned_bytes=loads.owned_bytes,
        rank_padding_bytes=loads.alloc_bytes - loads.owned_bytes,
        rank_fragments=frags,
        num_split_arrays=int(split.sum()),
        num_reduce_scatters=num_b, num_all_gathers=num_b, num_all_reduces=0, num_broadcasts=0,
        param_chunk_elems=none, param_owner=none, bucket_chunk_elems=chunks,
    )


def _plan_greedy(bp: BucketPlan, n: int, **_) -> ShardPlan:
    """Whole arrays dealt to ranks, largest first, to the least loaded (ZeroRedundancyOptimizer)."""
    nbytes = bp.spec.sizes * bp.spec.itemsizes
    owners = _greedy_owners(nbytes, n)
    owned = np.bincount(owners, weights=nbytes, minlength=n).astype(np.int64)
    frags = np.bincount(owners, minlength=n).astype(np.int64)
    return ShardPlan(
        bp, n, "greedy", False,
        rank_owned_bytes=owned,
        rank_padding_bytes=np.zeros(n, np.int64),
        rank_fragments=frags,
        num_split_arrays=0,
        num_reduce_scatters=0, num_all_gathers=0, num_all_reduces=bp.num_buckets,
        num_broadcasts=int((frags > 0).sum()),
        param_chunk_elems=np.zeros(len(bp.spec), np.int64), param_owner=owners,
        bucket_chunk_elems=np.zeros(bp.num_buckets, np.int64),
    )


#: Each layout's planner (:data:`LAYOUTS`).
_PLANNERS = {"row": _plan_row, "flat": _plan_flat, "greedy": _plan_greedy}

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
produced on demand per rank (:meth:`ShardPlan.rank_slices`).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Iterator, NamedTuple

import numpy as np

from workbench.core.buckets import BucketPlan
from workbench.core.checks import MAX_NUM_SHARDS, as_whole, integer

LAYOUTS = ("row", "flat", "greedy")


class ShardSlice(NamedTuple):
    """Elements ``[start, stop)`` of the flattened parameter ``path``, in bucket ``bucket``."""

    bucket: int
    path: str
    start: int
    stop: int


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


@dataclass(frozen=True)
class ShardPlan:
    """Ownership of every gradient element, per rank and bucket.

    Attributes:
        buckets: The bucket plan this shards.
        num_shards: N, the number of ranks in the sharding group.
        layout: ``"row"``, ``"flat"`` or ``"greedy"``.
        pad_rows: Whether ``row`` pads arrays whose size is not a multiple of N.
        rank_owned_bytes: Real bytes each rank owns, shape (N,).
        rank_padding_bytes: Padding bytes each rank carries, shape (N,).
        rank_fragments: Contiguous pieces of parameters each rank owns, shape (N,);
            the fragmentation of its optimizer state.
        num_split_arrays: Arrays whose elements are owned by more than one rank.
        num_reduce_scatters, num_all_gathers, num_all_reduces, num_broadcasts:
            Collectives per optimizer step.
    """

    buckets: BucketPlan
    num_shards: int
    layout: str
    pad_rows: bool
    rank_owned_bytes: np.ndarray = field(repr=False)
    rank_padding_bytes: np.ndarray = field(repr=False)
    rank_fragments: np.ndarray = field(repr=False)
    num_split_arrays: int
    num_reduce_scatters: int
    num_all_gathers: int
    num_all_reduces: int
    num_broadcasts: int
    # Per parameter (by parameter index): chunk elements (row) / owner rank (greedy).
    param_chunk_elems: np.ndarray = field(repr=False)
    param_owner: np.ndarray = field(repr=False)
    # Per bucket: chunk elements each rank holds of it (row: sum of its arrays' chunks; flat: bucket chunk).
    bucket_chunk_elems: np.ndarray = field(repr=False)

    @property
    def rank_bytes(self) -> np.ndarray:
        """Bytes each rank holds for its shard (real + padding), shape (N,)."""
        return self.rank_owned_bytes + self.rank_padding_bytes

    @property
    def imbalance(self) -> float:
        """max / mean of :attr:`rank_bytes` (1.0 is perfectly balanced)."""
        mean = self.rank_bytes.mean()
        return float(self.rank_bytes.max() / mean) if mean > 0 else 1.0

    @property
    def padding_bytes(self) -> int:
        """Padding bytes over all ranks."""
        return int(self.rank_padding_bytes.sum())

    @property
    def num_collectives_per_step(self) -> int:
        return self.num_reduce_scatters + self.num_all_gathers + self.num_all_reduces + self.num_broadcasts

    def summary(self) -> dict:
        """The layout metrics as plain numbers (one row of a comparison table)."""
        return {
            "layout": self.layout,
            "num_shards": self.num_shards,
            "num_buckets": self.buckets.num_buckets,
            "max_rank_bytes": int(self.rank_bytes.max()),
            "mean_rank_bytes": float(self.rank_bytes.mean()),
            "imbalance": self.imbalance,
            "padding_bytes": self.padding_bytes,
            "num_split_arrays": self.num_split_arrays,
            "max_fragments_per_rank": int(self.rank_fragments.max()),
            "mean_fragments_per_rank": float(self.rank_fragments.mean()),
            "num_collectives_per_step": self.num_collectives_per_step,
        }

    def _param_offsets(self) -> np.ndarray:
        """Offset of each parameter inside its bucket's flattened buffer (by parameter index)."""
        bp = self.buckets
        sizes = bp.spec.sizes[bp.order]
        csum = np.cumsum(sizes) - sizes
        starts = np.repeat(csum[bp.offsets[:-1]], np.diff(bp.offsets))
        out = np.empty(len(bp.order), np.int64)
        out[bp.order] = csum - starts
        return out

    def rank_slices(self, rank: int, bucket: int | None = None) -> list[ShardSlice]:
        """The pieces rank ``rank`` owns, bucket by bucket, in its local buffer order.

        Args:
            rank: 0 <= rank < N.
            bucket: Only this bucket's pieces (default: every bucket).
        """
        if as_whole(rank) is None or not 0 <= as_whole(rank) < self.num_shards:
            raise ValueError(f"rank {rank!r} is not an integer in range for num_shards={self.num_shards}.")
        rank = as_whole(rank)
        bp = self.buckets
        if bucket is None:
            lo, hi = 0, len(bp.order)
        elif 0 <= bucket < bp.num_buckets:
            lo, hi = int(bp.offsets[bucket]), int(bp.offsets[bucket + 1])
        else:
            raise ValueError(f"bucket {bucket} is out of range: the plan has {bp.num_buckets} buckets.")
        order = bp.order[lo:hi]
        sizes = bp.spec.sizes[order]
        buckets_of = np.repeat(np.arange(bp.num_buckets), np.diff(bp.offsets))[lo:hi]
        if self.layout == "row":
            c = self.param_chunk_elems[order]
            start = np.minimum(rank * c, sizes)
            stop = np.minimum(start + c, sizes)
        elif self.layout == "flat":
            c = self.bucket_chunk_elems[buckets_of]
            poff = self._param_offsets()[order]
            start = np.clip(rank * c - poff, 0, sizes)
            stop = np.clip((rank + 1) * c - poff, 0, sizes)
        else:
            start = np.where(self.param_owner[order] == rank, 0, sizes)
            stop = sizes
        keep = np.nonzero(start < stop)[0]
        params = bp.spec.params
        return [
            ShardSlice(int(buckets_of[k]), params[int(order[k])].path, int(start[k]), int(stop[k])) for k in keep
        ]

    def iter_slices(self) -> Iterator[tuple[int, ShardSlice]]:
        """Every ``(rank, slice)`` of the plan (use on small plans: it materialises them)."""
        for r in range(self.num_shards):
            for s in self.rank_slices(r):
                yield r, s


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
    bp = bucket_plan
    spec = bp.spec
    sizes, isz = spec.sizes, spec.itemsizes
    num_b = bp.num_buckets
    none = np.zeros(len(spec), np.int64)

    if layout == "row":
        _check_row(bp, n, pad_rows, require_axis0)
        chunks = -(-sizes // n)
        loads = _chunk_loads(sizes, isz, chunks, n)
        bucket_chunk = np.add.reduceat(chunks[bp.order], bp.offsets[:-1]) if num_b else np.zeros(0, np.int64)
        return ShardPlan(
            bp, n, layout, pad_rows,
            rank_owned_bytes=loads.owned_bytes,
            rank_padding_bytes=loads.alloc_bytes - loads.owned_bytes,
            rank_fragments=loads.nonempty,
            num_split_arrays=int((loads.num_chunks > 1).sum()),
            num_reduce_scatters=num_b, num_all_gathers=num_b, num_all_reduces=0, num_broadcasts=0,
            param_chunk_elems=chunks, param_owner=none, bucket_chunk_elems=bucket_chunk,
        )

    if layout == "flat":
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
        return ShardPlan(
            bp, n, layout, False,
            rank_owned_bytes=loads.owned_bytes,
            rank_padding_bytes=loads.alloc_bytes - loads.owned_bytes,
            rank_fragments=frags,
            num_split_arrays=int(split.sum()),
            num_reduce_scatters=num_b, num_all_gathers=num_b, num_all_reduces=0, num_broadcasts=0,
            param_chunk_elems=none, param_owner=none, bucket_chunk_elems=chunks,
        )

    nbytes = sizes * isz
    owners = _greedy_owners(nbytes, n)
    owned = np.bincount(owners, weights=nbytes, minlength=n).astype(np.int64)
    frags = np.bincount(owners, minlength=n).astype(np.int64)
    return ShardPlan(
        bp, n, layout, False,
        rank_owned_bytes=owned,
        rank_padding_bytes=np.zeros(n, np.int64),
        rank_fragments=frags,
        num_split_arrays=0,
        num_reduce_scatters=0, num_all_gathers=0, num_all_reduces=num_b, num_broadcasts=int((frags > 0).sum()),
        param_chunk_elems=none, param_owner=owners, bucket_chunk_elems=np.zeros(num_b, np.int64),
    )

"""A shard plan: which rank owns which elements of which gradient bucket (the record; the planners are
:mod:`workbench.core.shards`). Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, NamedTuple

import numpy as np

from workbench.core.buckets import BucketPlan
from workbench.core.checks import as_whole


class ShardSlice(NamedTuple):
    """Elements ``[start, stop)`` of the flattened parameter ``path``, in bucket ``bucket``."""

    bucket: int
    path: str
    start: int
    stop: int


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

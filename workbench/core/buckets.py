"""Bucket planning: how gradients are grouped before each collective.

A bucket is a list of parameters whose gradients are concatenated and sent in one
collective (an all-reduce under DDP, a reduce-scatter plus an all-gather under
FSDP). Planning is a pure function of sizes; the adapters do the collectives.

Policies:

* ``"mlx"`` -- exactly ``mlx.nn.utils._group_by_size`` (mlx 0.32): walk the
  parameters in flatten order, append the array, then close the bucket once its
  bytes are ``>= communication_size``. Buckets end at or just above the
  threshold; a small tail bucket is possible; ``communication_size <= 0`` gives
  one bucket per array.
* ``"pytorch-ddp"`` -- PyTorch DDP's ``compute_bucket_assignment_by_size``
  (``torch/csrc/distributed/c10d/reducer.cpp``) as used when buckets are
  rebuilt after the first step: parameters in *reverse* order (roughly the order
  gradients become ready), one open bucket per dtype, the same append-then-close
  ``>=`` test, the first bucket of each dtype capped at 1 MiB and the later ones
  at the cap (25 MiB by default, ``bucket_cap_mb``).

A bucket never mixes dtypes. MLX differs here: its ``average_gradients`` sizes
groups by the first array's dtype and, if dtypes are mixed anywhere in the tree,
gives up grouping altogether (one all-reduce per array); the 0.31
``fsdp_apply_gradients`` concatenated mixed groups and silently promoted bf16 to
fp32. The ``"mlx"`` policy here instead closes the open bucket when the dtype
changes, so single-dtype trees are planned exactly as MLX plans them and mixed
trees keep their grouping without promotion.

A custom :class:`BucketPolicy` may also close *before* an array would overflow the
cap (``close="before_overflow"``), the rule of DeepSpeed ZeRO-1/2's reduce bucket
(``if elements + numel > reduce_bucket_size: flush``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from workbench.core.checks import byte_count
from workbench.core.specs import ModelSpec
from workbench.core.units import MiB


@dataclass(frozen=True, kw_only=True)
class BucketPolicy:
    """How a planner walks parameters and decides where a bucket ends.

    Attributes:
        name: Label used in figures and run records.
        order: ``"forward"`` (flatten order) or ``"reverse"``.
        close: ``"at_threshold"`` (append, then close once bytes ``>=`` cap) or
            ``"before_overflow"`` (close first if the array would push the bucket
            past the cap).
        per_dtype: ``True`` keeps one open bucket per dtype (PyTorch); ``False``
            closes the open bucket when the dtype changes.
        first_bucket_bytes: Cap of the first bucket of each dtype in bytes, or
            ``None`` to use the common cap for every bucket.
        default_communication_size: Cap in bytes used when the caller passes none.
    """

    name: str
    order: Literal["forward", "reverse"] = "forward"
    close: Literal["at_threshold", "before_overflow"] = "at_threshold"
    per_dtype: bool = False
    first_bucket_bytes: int | None = None
    default_communication_size: int = 32 * MiB

    def __post_init__(self) -> None:
        if self.order not in ("forward", "reverse"):
            raise ValueError(f"BucketPolicy.order must be 'forward' or 'reverse', got {self.order!r}.")
        if self.close not in ("at_threshold", "before_overflow"):
            raise ValueError(f"BucketPolicy.close must be 'at_threshold' or 'before_overflow', got {self.close!r}.")


POLICIES: dict[str, BucketPolicy] = {
    "mlx": BucketPolicy(name="mlx"),
    "pytorch-ddp": BucketPolicy(
        name="pytorch-ddp",
        order="reverse",
        per_dtype=True,
        first_bucket_bytes=1 * MiB,
        default_communication_size=25 * MiB,
    ),
}


def get_policy(policy: str | BucketPolicy) -> BucketPolicy:
    """Resolve a policy name (see :data:`POLICIES`) or pass a policy through."""
    if isinstance(policy, BucketPolicy):
        return policy
    try:
        return POLICIES[policy]
    except (KeyError, TypeError):
        raise ValueError(f"Unknown bucket policy {policy!r}; known policies: {', '.join(POLICIES)}.") from None


@dataclass(frozen=True)
class BucketPlan:
    """Parameters grouped into buckets.

    Bucket ``b`` holds the parameter indices ``order[offsets[b]:offsets[b + 1]]``,
    in the order their gradients are concatenated.

    Attributes:
        spec: The planned model.
        policy: The policy used.
        communication_size: The cap in bytes (``<= 0``: one bucket per array).
        order: Parameter indices, bucket after bucket (int64, length = #params).
        offsets: Bucket boundaries into ``order`` (int64, length = #buckets + 1).
    """

    spec: ModelSpec
    policy: BucketPolicy
    communication_size: int
    order: np.ndarray
    offsets: np.ndarray
    bucket_elems: np.ndarray = field(init=False, repr=False, compare=False)
    bucket_itemsize: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        sizes = self.spec.sizes[self.order]
        starts = self.offsets[:-1]
        elems = np.add.reduceat(sizes, starts) if len(starts) else np.zeros(0, np.int64)
        object.__setattr__(self, "bucket_elems", elems.astype(np.int64))
        object.__setattr__(self, "bucket_itemsize", self.spec.itemsizes[self.order[starts]] if len(starts) else np.zeros(0, np.int64))

    @property
    def num_buckets(self) -> int:
        return len(self.offsets) - 1

    @property
    def bucket_bytes(self) -> np.ndarray:
        """Bytes per bucket (int64 array)."""
        return self.bucket_elems * self.bucket_itemsize

    def bucket(self, b: int) -> np.ndarray:
        """Parameter indices of bucket ``b``, in concatenation order."""
        if not 0 <= b < self.num_buckets:
            raise IndexError(f"Bucket {b} out of range: the plan has {self.num_buckets} buckets.")
        return self.order[self.offsets[b] : self.offsets[b + 1]]

    def bucket_paths(self, b: int) -> list[str]:
        return [self.spec.params[i].path for i in self.bucket(b)]

    def bucket_dtype(self, b: int) -> str:
        return self.spec.params[int(self.order[self.offsets[b]])].dtype

    @property
    def bucket_of_param(self) -> np.ndarray:
        """Bucket index of each parameter, by parameter index."""
        out = np.empty(len(self.order), np.int64)
        out[self.order] = np.repeat(np.arange(self.num_buckets), np.diff(self.offsets))
        return out

    @property
    def num_allreduces_per_step(self) -> int:
        """Collectives a DDP step makes with this plan (one all-reduce per bucket)."""
        return self.num_buckets

    def summary(self) -> dict:
        """The plan's headline numbers (one row of a comparison table)."""
        b = self.bucket_bytes
        return {
            "policy": self.policy.name,
            "communication_size_bytes": self.communication_size,
            "num_buckets": self.num_buckets,
            "num_allreduces_per_step": self.num_allreduces_per_step,
            "num_under_threshold": self.num_under_threshold,
            "min_bucket_bytes": int(b.min()) if len(b) else 0,
            "median_bucket_bytes": float(np.median(b)) if len(b) else 0.0,
            "max_bucket_bytes": int(b.max()) if len(b) else 0,
            "max_arrays_per_bucket": int(np.diff(self.offsets).max()) if len(b) else 0,
        }

    def busiest_bucket(self) -> int:
        """Index of the bucket holding the most arrays (the most telling one to draw)."""
        return int(np.argmax(np.diff(self.offsets)))

    @property
    def num_under_threshold(self) -> int:
        """Buckets that close below the cap (the tail, and buckets cut by a dtype change)."""
        if self.communication_size <= 0:
            return 0
        return int((self.bucket_bytes < self.communication_size).sum())


def _validate_for_planning(spec: ModelSpec) -> None:
    if spec.sizes.all():
        return
    for p in spec.params:
        if p.size == 0:
            raise ValueError(f"Parameter '{p.path}' with shape {p.shape} has no elements; zero-size arrays cannot be bucketed.")


def plan_buckets(
    params: ModelSpec,
    communication_size: int | None = None,
    *,
    policy: str | BucketPolicy = "mlx",
) -> BucketPlan:
    """Group parameters into communication buckets.

    Args:
        params: The model's parameters in flatten order.
        communication_size: Cap in bytes. Default: the policy's (32 MiB for
            ``"mlx"``, 25 MiB for ``"pytorch-ddp"``). ``<= 0`` disables grouping:
            one bucket per array.
        policy: A name from :data:`POLICIES` or a :class:`BucketPolicy`.

    Returns:
        A :class:`BucketPlan`.

    Raises:
        ValueError: for a zero-size parameter (named with its shape), an unknown policy, or a
            ``communication_size`` that is not a whole number of bytes (NaN, inf, ``"32MB"``, 0.5, True).
    """
    pol = get_policy(policy)
    if not isinstance(params, ModelSpec):
        raise ValueError(f"plan_buckets needs a ModelSpec, got {type(params).__name__}; build one with workbench.core.specs or an adapter.")
    _validate_for_planning(params)
    cap = pol.default_communication_size if communication_size is None else byte_count("communication_size", communication_size)
    n = len(params)
    walk = range(n - 1, -1, -1) if pol.order == "reverse" else range(n)
    sizes = params.sizes.tolist()
    itemsizes = params.itemsizes.tolist()
    dtypes = [p.dtype for p in params.params]

    buckets: list[list[int]] = []
    open_buckets: dict[str, list] = {}  # dtype -> [indices, bytes, limit_index]
    limits = [cap] if pol.first_bucket_bytes is None else [pol.first_bucket_bytes, cap]
    current_dtype: str | None = None
    for i in walk:
        dt = dtypes[i]
        nbytes = sizes[i] * itemsizes[i]
        if not pol.per_dtype and current_dtype is not None and dt != current_dtype:
            for key, (idx, _, _) in open_buckets.items():
                if idx:
                    buckets.append(idx)
            open_buckets.clear()
        current_dtype = dt
        state = open_buckets.setdefault(dt, [[], 0, 0])
        limit = limits[state[2]] if cap > 0 else 0
        if pol.close == "before_overflow" and state[0] and state[1] + nbytes > limit:
            buckets.append(state[0])
            state[0], state[1] = [], 0
            state[2] = min(state[2] + 1, len(limits) - 1)
            limit = limits[state[2]] if cap > 0 else 0
        state[0].append(i)
        state[1] += nbytes
        if state[1] >= limit:
            buckets.append(state[0])
            state[0], state[1] = [], 0
            state[2] = min(state[2] + 1, len(limits) - 1)
    # Open buckets close in the order their first parameter was walked.
    rest = [idx for idx, _, _ in open_buckets.values() if idx]
    rank_in_walk = {i: k for k, i in enumerate(walk)}
    buckets.extend(sorted(rest, key=lambda idx: rank_in_walk[idx[0]]))

    order = np.fromiter((i for b in buckets for i in b), dtype=np.int64, count=n)
    offsets = np.zeros(len(buckets) + 1, np.int64)
    np.cumsum([len(b) for b in buckets], out=offsets[1:])
    return BucketPlan(spec=params, policy=pol, communication_size=cap, order=order, offsets=offsets)

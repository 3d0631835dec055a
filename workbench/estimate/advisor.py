"""Which ``communication_size`` to use: the bucket size that minimises the predicted sync time.

Users have asked for this tool (pytorch/pytorch#118421: "we ought to build a tool for users to find
their own optimal size"). The model: for each candidate size, plan the buckets
(:func:`workbench.core.buckets.plan_buckets`) and the shards (:func:`workbench.core.shards.plan_shards`),
count each rank's collectives and bytes (:func:`workbench.estimate.comm.estimate_comm`) and price them with
the machine's fitted alpha-beta links (:func:`workbench.estimate.comm.fit_alpha_beta`, one link per
collective kind), plus a fixed cost per bucket that the links do not see (a framework's dispatch and
synchronisation per bucket). Nothing overlaps: each bucket's latency adds to the bytes' time.

With no overlap the sync time falls as buckets grow (fewer latencies) and flattens once the latencies
are small beside the bytes; larger buckets then buy nothing but transient memory (a bucket's rows,
receive buffer and gathered copy). So the advice is the *smallest* size whose predicted sync time is
within ``tolerance`` of the minimum: the knee of the curve. Pure: standard library and NumPy only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from workbench.core.buckets import plan_buckets
from workbench.core.checks import as_whole, integer
from workbench.core.shards import plan_shards
from workbench.core.specs import ModelSpec
from workbench.core.units import KiB
from workbench.estimate.comm import AlphaBeta, estimate_comm
from workbench.strategies import get_strategy, strategies

#: Strategies the advisor prices: DDP all-reduces each bucket; FSDP reduce-scatters and all-gathers it.
#: What the advisor prices: the strategies that sync by buckets of ``communication_size`` and keep the
#: parameters whole (DDP, ZeRO-1/2-like); a unit-gathering strategy has no bucket size to advise.
ADVISED_STRATEGIES = tuple(s.name for s in strategies() if s.units == "buckets" and not s.gathers_units
                           and not s.replicas)  # HSDP's buckets also cross its replica groups: not priced here


@dataclass(frozen=True, kw_only=True)
class SizePrediction:
    """The prediction at one ``communication_size`` (bytes): buckets, sync and step seconds per step."""

    communication_size: int
    num_buckets: int
    predicted_sync_s: float
    predicted_step_s: float


@dataclass(frozen=True, kw_only=True)
class BucketAdvice:
    """The recommended ``communication_size`` (bytes) and the predicted curve it was chosen from.

    Attributes:
        communication_size: The recommendation: the smallest candidate whose predicted sync time is
            within ``tolerance`` of the minimum.
        num_buckets: Buckets at the recommendation.
        predicted_sync_s: Predicted seconds of one step's collectives at the recommendation.
        predicted_step_s: ``base_s`` plus the sync time.
        curve: Every candidate, smallest size first (to draw).
        tolerance: The relative slack that picked the knee.
    """

    communication_size: int
    num_buckets: int
    predicted_sync_s: float
    predicted_step_s: float
    curve: tuple[SizePrediction, ...]
    tolerance: float


def default_sizes(spec: ModelSpec, smallest: int = 256 * KiB) -> tuple[int, ...]:
    """Powers of two from ``smallest`` bytes up to the first one that holds the whole model (one bucket)."""
    if smallest < 1:
        raise ValueError(f"smallest must be >= 1 byte, got {smallest!r}.")
    sizes, s = [], 1 << (int(smallest) - 1).bit_length()
    while True:
        sizes.append(s)
        if s >= spec.nbytes:
            return tuple(sizes)
        s *= 2


def links_by_kind(links: Mapping, framework: str) -> dict[str, AlphaBeta]:
    """``{kind: AlphaBeta}`` from either ``{kind: ...}`` or fit_links' ``{(framework, kind): ...}``."""
    out = {}
    for key, link in links.items():
        if isinstance(key, tuple):
            if key[0] == framework:
                out[key[1]] = link
        else:
            out[key] = link
    return out


def predict_sync_curve(spec: ModelSpec, num_shards: int, links: Mapping, *, sizes: Sequence[int] | None = None,
                       layout: str = "row", strategy: str = "fsdp", framework: str = "mlx",
                       per_bucket_s: float = 0.0, base_s: float = 0.0) -> tuple[SizePrediction, ...]:
    """Predicted sync and step seconds per step at each candidate ``communication_size``.

    Args:
        spec: The model's parameters.
        num_shards: N, the ranks in the group.
        links: Fitted links by collective kind (``{"reduce_scatter": AlphaBeta, ...}``), or
            ``fit_links``' ``{(framework, kind): AlphaBeta}``.
        sizes: Candidate sizes in bytes (default :func:`default_sizes`), each > 0.
        layout: ``"row"`` or ``"flat"`` (``"flat"`` pads each bucket to a multiple of N).
        strategy: One of :data:`ADVISED_STRATEGIES`: ``"ddp"`` (all-reduce per bucket), or a ZeRO-1/2-like
            one (reduce-scatter + all-gather per bucket; ``fsdp-row`` / ``fsdp-flat`` fix the layout).
        framework: Which framework's links to read from a ``fit_links`` mapping.
        per_bucket_s: Seconds each bucket costs beyond its collectives' alpha (>= 0).
        base_s: Seconds of the step that do not depend on the bucket size (gradient, update).

    Raises:
        ValueError: on a bad knob, naming it; a missing link names the kind.
    """
    if strategy not in ADVISED_STRATEGIES:
        raise ValueError(f"Unknown strategy {strategy!r}; the advisor prices {', '.join(ADVISED_STRATEGIES)}.")
    record = get_strategy(strategy)
    layout = record.layout or layout  # fsdp-row and fsdp-flat name their layout
    num_shards = integer("num_shards", num_shards, low=1)
    if not per_bucket_s >= 0 or not base_s >= 0:
        raise ValueError(f"per_bucket_s and base_s must be >= 0, got {per_bucket_s!r} and {base_s!r}.")
    sizes = default_sizes(spec) if sizes is None else tuple(sizes)
    if not sizes or any(as_whole(s) is None or as_whole(s) <= 0 for s in sizes):
        raise ValueError(f"sizes must be positive integers (bytes), got {list(sizes)!r}.")
    sizes = tuple(as_whole(s) for s in sizes)
    by_kind = links_by_kind(links, framework)
    curve = []
    for size in sorted(set(sizes)):
        buckets = plan_buckets(spec, size)
        plan = plan_shards(buckets, num_shards, layout) if record.family == "zero_1_2" else buckets
        comm = estimate_comm(plan, strategy, num_shards)
        sync = 0.0
        for c in comm.collectives:
            if c.num_collectives and num_shards > 1:
                if c.kind not in by_kind:
                    raise ValueError(f"No fitted link for {framework} {c.kind}: measure that collective first.")
                sync += float(by_kind[c.kind].predict_s(c.rank_bytes, c.num_steps))
        sync += per_bucket_s * buckets.num_buckets
        curve.append(SizePrediction(communication_size=size, num_buckets=buckets.num_buckets,
                                    predicted_sync_s=sync, predicted_step_s=base_s + sync))
    return tuple(curve)


def recommend_communication_size(spec: ModelSpec, num_shards: int, links: Mapping, *,
                                 sizes: Sequence[int] | None = None, layout: str = "row", strategy: str = "fsdp",
                                 framework: str = "mlx", per_bucket_s: float = 0.0, base_s: float = 0.0,
                                 tolerance: float = 0.01) -> BucketAdvice:
    """The bucket size (bytes) to pass as ``communication_size``, and the predicted curve.

    Takes the smallest candidate whose predicted sync time is at most ``(1 + tolerance)`` times the
    smallest predicted: beyond that knee a larger bucket saves almost no time and costs transient
    memory. Arguments as :func:`predict_sync_curve`; ``tolerance`` >= 0 (0 takes the exact minimum).
    """
    if not tolerance >= 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance!r}.")
    curve = predict_sync_curve(spec, num_shards, links, sizes=sizes, layout=layout, strategy=strategy,
                               framework=framework, per_bucket_s=per_bucket_s, base_s=base_s)
    best = min(p.predicted_sync_s for p in curve)
    pick = next(p for p in curve if p.predicted_sync_s <= best * (1 + tolerance))
    return BucketAdvice(communication_size=pick.communication_size, num_buckets=pick.num_buckets,
                        predicted_sync_s=pick.predicted_sync_s, predicted_step_s=pick.predicted_step_s,
                        curve=curve, tolerance=float(tolerance))


def fit_bucket_costs(num_buckets: Sequence[int], residual_s: Sequence[float]) -> tuple[float, float]:
    """``(base_s, per_bucket_s)``: a sweep's measured steps less their link-priced sync (``residual_s``, one per
    size) fitted as ``base_s + per_bucket_s * buckets`` by least squares, neither below 0. With fewer than two
    bucket counts, or residuals that fall as buckets are added (noise), no per-bucket cost: the residuals' median.

    Raises:
        ValueError: no sizes, or the two sequences of different lengths.
    """
    b, r = np.asarray(num_buckets, dtype=float), np.asarray(residual_s, dtype=float)
    if not len(b) or b.shape != r.shape:
        raise ValueError(f"fit_bucket_costs: {len(b)} bucket counts against {len(r)} residuals")
    if not np.isfinite(r).all():
        raise ValueError(f"fit_bucket_costs: residuals {r.tolist()} are not all finite (a size with no steps?)")
    flat = (max(0.0, float(np.median(r))), 0.0)
    if len(set(b.tolist())) < 2:
        return flat
    slope, base = np.polyfit(b, r, 1)
    if slope <= 0:
        return flat
    if base < 0:  # through the origin
        return 0.0, float(max(0.0, (b @ r) / (b @ b)))
    return float(base), float(slope)

"""Communication per training step: bytes each rank sends, collectives, and their time.

Ring collectives of V bytes over N ranks (Patarasuk and Yuan 2009; the scaling book, "How to
Scale Your Model", Austin et al. 2025, Part 3): all-gather and reduce-scatter send
V (N - 1) / N bytes per rank in N - 1 steps; all-reduce sends 2 V (N - 1) / N in 2 (N - 1)
steps. Per step, DDP all-reduces every bucket (2 Psi elements per rank, ZeRO paper Sec. 7);
ZeRO-1/2 and MLX's FSDP reduce-scatter the gradients and all-gather the parameters (2 Psi);
ZeRO-3 all-gathers again in forward (3 Psi, or 2 Psi without resharding). nccl-tests report
``algbw = V / t`` and ``busbw = algbw * factor`` with the same factors (``doc/PERFORMANCE.md``).
Pure: standard library and NumPy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.core.buckets import BucketPlan
from workbench.core.shards import ShardPlan
from workbench.strategies import NAMES, StepShape, bus_factor, get_strategy, ring_steps, strategies
from workbench.strategies.collectives import count_of_ranks as _ranks

STRATEGIES = NAMES  # every registered strategy has a communication model (workbench.strategies)


def algbw(nbytes: float, time_s: float) -> float:
    """Algorithm bandwidth in bytes/s: the collective's size V over its time (nccl-tests)."""
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes!r}.")
    if time_s <= 0:
        raise ValueError(f"time_s must be > 0, got {time_s!r}.")
    return nbytes / time_s


def busbw(kind: str, nbytes: float, time_s: float, num_ranks: int) -> float:
    """Bus bandwidth in bytes/s: :func:`algbw` times :func:`bus_factor`, comparable to link speed."""
    return algbw(nbytes, time_s) * bus_factor(kind, num_ranks)


@dataclass(frozen=True)
class AlphaBeta:
    """Latency-bandwidth model ``t = alpha_s * steps + nbytes / beta_bytes_per_s`` (Hockney 1994).

    Attributes:
        alpha_s: Latency per step in seconds (>= 0).
        beta_bytes_per_s: Bandwidth of the link in bytes per second (> 0).
    """

    alpha_s: float
    beta_bytes_per_s: float

    def __post_init__(self) -> None:
        if not np.isfinite(self.alpha_s) or self.alpha_s < 0:
            raise ValueError(f"alpha_s must be a finite number >= 0, got {self.alpha_s!r}.")
        if not np.isfinite(self.beta_bytes_per_s) or self.beta_bytes_per_s <= 0:
            raise ValueError(f"beta_bytes_per_s must be a finite number > 0, got {self.beta_bytes_per_s!r}.")

    def predict_s(self, nbytes, steps=1):
        """Seconds to send ``nbytes`` (per rank) in ``steps`` latency terms; broadcasts over arrays."""
        return self.alpha_s * np.asarray(steps, float) + np.asarray(nbytes, float) / self.beta_bytes_per_s


def fit_alpha_beta(sizes_bytes, times_s, steps=1, *, relative: bool = False) -> AlphaBeta:
    """Least-squares fit of :class:`AlphaBeta` to measured ``(bytes, seconds)`` points.

    Args:
        sizes_bytes: Bytes sent per rank of each measurement.
        times_s: Seconds of each measurement.
        steps: Latency terms per measurement (a number or one per point), e.g. :func:`ring_steps`.
        relative: Minimise relative rather than absolute residuals, so that small messages (which
            set the latency) weigh as much as large ones (which set the bandwidth) over a sweep of
            sizes spanning 1 KiB to 256 MiB, as nccl-tests' are.

    Returns:
        The fit; if the unconstrained fit gives a negative latency, latency 0 and the
        bandwidth-only least squares.

    Raises:
        ValueError: on fewer than 2 points, lengths that differ, sizes that cannot separate
            latency from bandwidth, or times that do not grow with size.
    """
    x, t = np.asarray(sizes_bytes, float).ravel(), np.asarray(times_s, float).ravel()
    if len(x) < 2:
        raise ValueError(f"sizes_bytes needs at least 2 points to fit alpha and beta, got {len(x)}.")
    if len(t) != len(x):
        raise ValueError(f"times_s has {len(t)} points but sizes_bytes has {len(x)}.")
    k = np.broadcast_to(np.asarray(steps, float), x.shape)
    design = np.column_stack([k, x])
    if np.linalg.matrix_rank(design) < 2:
        raise ValueError("sizes_bytes (with steps) must vary to separate latency from bandwidth.")
    if relative and not (t > 0).all():
        raise ValueError("times_s must all be > 0 for a relative fit.")
    w = 1 / t if relative else np.ones_like(t)
    (alpha, inv_bw), *_ = np.linalg.lstsq(design * w[:, None], t * w, rcond=None)
    if alpha < 0:
        xw = x * w
        alpha, inv_bw = 0.0, float(xw @ (t * w) / (xw @ xw))
    if inv_bw <= 0:
        raise ValueError("times_s do not grow with sizes_bytes: the fitted bandwidth is not positive.")
    return AlphaBeta(float(alpha), float(1.0 / inv_bw))


@dataclass(frozen=True)
class CollectiveCost:
    """``num_collectives`` collectives of one kind: ``rank_bytes`` sent per rank in all, ``num_steps`` latency terms."""

    kind: str
    num_collectives: int
    rank_bytes: float
    num_steps: int


@dataclass(frozen=True, kw_only=True)
class CommEstimate:
    """Per-step communication of one strategy, per rank."""

    strategy: str
    num_shards: int
    num_replicas: int
    collectives: tuple[CollectiveCost, ...]

    @property
    def rank_bytes(self) -> float:
        return float(sum(c.rank_bytes for c in self.collectives))

    @property
    def num_collectives(self) -> int:
        return sum(c.num_collectives for c in self.collectives)

    def bytes_of(self, kind: str) -> float:
        """Bytes per rank of all collectives of ``kind``."""
        return float(sum(c.rank_bytes for c in self.collectives if c.kind == kind))

    def predict_s(self, link: AlphaBeta) -> float:
        """Seconds per step if nothing overlaps: sum of ``alpha * steps + bytes / beta``."""
        return float(sum(link.predict_s(c.rank_bytes, c.num_steps) for c in self.collectives))


def estimate_comm(plan: BucketPlan | ShardPlan, strategy: str = "fsdp", num_shards: int | None = None, *,
                  num_replicas: int = 1, reshard_after_forward: bool = True) -> CommEstimate:
    """Bytes each rank sends and collectives it joins in one optimizer step.

    Args:
        plan: A :class:`BucketPlan` (one collective per bucket and kind), or a
            :class:`ShardPlan` (its padded buckets; a ``greedy`` plan all-reduces, then
            broadcasts each rank's arrays, as ``ZeroRedundancyOptimizer``).
        strategy: One of :data:`STRATEGIES`. Under ``zero3`` / ``hsdp`` the buckets are the units.
        num_shards: N; taken from a shard plan (must match if given).
        num_replicas: ``hsdp``: replica groups that all-reduce each shard (2(R-1)/R x V/N).
        reshard_after_forward: ``zero3`` / ``hsdp``: re-gather in backward (3 Psi instead of 2 Psi).

    Raises:
        ValueError: on an unknown strategy, a non-boolean ``reshard_after_forward``, ``num_shards`` missing, < 1 or not the plan's,
            ``num_replicas`` != 1 outside ``hsdp``, or a greedy plan under a sharding strategy.
    """
    record = get_strategy(strategy)  # an unknown name lists the registered ones
    if not isinstance(reshard_after_forward, bool):
        raise ValueError(f"reshard_after_forward must be True or False, got {reshard_after_forward!r}.")
    r = _ranks("num_replicas", num_replicas)
    if not record.replicas and r != 1:
        raise ValueError(f"num_replicas={r} applies to a replicated strategy "
                         f"({', '.join(s.name for s in strategies() if s.replicas)}) only; got strategy {strategy!r}.")
    if isinstance(plan, ShardPlan):
        if num_shards is not None and _ranks("num_shards", num_shards) != plan.num_shards:
            raise ValueError(f"num_shards={num_shards} but the shard plan is for {plan.num_shards}.")
        n, bp = plan.num_shards, plan.buckets
        greedy = plan.layout == "greedy"
        if greedy and record.family != "data_parallel" and not record.greedy:
            raise ValueError(f"A greedy shard plan (layout='greedy') moves whole arrays: use strategy "
                             f"{', '.join(repr(s.name) for s in strategies() if s.greedy)}, not {strategy!r}.")
        sizes = (bp.bucket_bytes if greedy else plan.bucket_chunk_elems * n * bp.bucket_itemsize).astype(float)
    elif isinstance(plan, BucketPlan):
        if num_shards is None:
            raise ValueError("num_shards is required with a BucketPlan.")
        n, bp, greedy = _ranks("num_shards", num_shards), plan, False
        sizes = plan.bucket_bytes.astype(float)
    else:
        raise ValueError(f"plan must be a BucketPlan or ShardPlan, got {type(plan).__name__}.")
    total = float(sizes.sum())

    if greedy:  # whole arrays: all-reduce, then (ZeRO-1) each rank broadcasts the arrays it updated
        rows = [CollectiveCost("all_reduce", len(sizes), bus_factor("all_reduce", n) * total,
                               len(sizes) * ring_steps("all_reduce", n))]
        if record.greedy:
            rows.append(CollectiveCost("broadcast", plan.num_broadcasts, total, plan.num_broadcasts * (n - 1)))
    else:
        shape = StepShape(num_ranks=n, sync_bytes=tuple(float(x) for x in sizes), num_replicas=r,
                          units=tuple((float(x), reshard_after_forward) for x in sizes))
        rows = [CollectiveCost(c.kind, c.count, c.rank_bytes, c.count * ring_steps(c.kind, c.group_size))
                for c in record.step_collectives(shape)]
    return CommEstimate(strategy=strategy, num_shards=n, num_replicas=r, collectives=tuple(rows))


@dataclass(frozen=True)
class DeviceSpec:
    """An accelerator's peak dense bf16 ``flops_per_s`` and per-direction link ``link_bytes_per_s``."""

    name: str
    flops_per_s: float
    link_bytes_per_s: float
    memory_bytes: int = 0
    source: str = "user"

    def __post_init__(self) -> None:
        for knob in ("flops_per_s", "link_bytes_per_s"):
            value = getattr(self, knob)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"DeviceSpec.{knob} must be a number > 0, got {value!r}.")
        if self.memory_bytes < 0:
            raise ValueError(f"DeviceSpec.memory_bytes must be >= 0, got {self.memory_bytes!r}.")


DEVICE_PRESETS: dict[str, DeviceSpec] = {
    "h100": DeviceSpec("H100 SXM", 989e12, 450e9, 80 * 10**9,
                       "NVIDIA H100 datasheet: 1,979 TFLOP/s bf16 with sparsity (989 dense); NVLink 4 900 GB/s "
                       "bidirectional per GPU (450 GB/s each way)"),
    "b200": DeviceSpec("B200 (HGX)", 2.25e15, 900e9, 180 * 10**9,
                       "NVIDIA HGX B200 datasheet: 4.5 PFLOP/s bf16 with sparsity per GPU (2.25 dense); NVLink 5 "
                       "1.8 TB/s bidirectional per GPU (900 GB/s each way); 180 GB HBM3e per GPU in HGX/DGX B200"),
}


def tokens_per_device_compute_bound(flops_per_s: float | DeviceSpec, link_bytes_per_s: float | None = None, *,
                                    bytes_per_param: float = 2, num_devices: int | None = None) -> float:
    """Tokens per device per step above which FSDP's collectives hide behind compute.

    Each pass over P parameters with T tokens per device costs 2TP FLOPs forward and 4TP
    backward. FSDP moves b P (N-1)/N bytes per all-gather or reduce-scatter: one in forward
    (ZeRO-3's gather), two in backward (re-gather and reduce-scatter; MLX's FSDP and ZeRO-2
    have the reduce-scatter and the update's all-gather). Either pass is compute-bound when
    ``2TP / C >= b P (N-1) / (N W)``, i.e. ``T >= (b / 2) (C / W) (N-1) / N``; with bf16
    (b = 2) and large N, ``T >= C / W``. The scaling book (Austin et al. 2025, "How to Scale
    Your Model", Part 5 "Training", FSDP: B/X > C/W_ici; Part 12 "GPUs": 990e12 / 450e9,
    about 2200 tokens per H100 inside a node) states the same.

    Args:
        flops_per_s: C, dense FLOP/s per device, or a :class:`DeviceSpec`.
        link_bytes_per_s: W, bytes/s per direction (from the device if one is given).
        bytes_per_param: b, bytes of each gathered parameter and reduced gradient.
        num_devices: N; ``None`` takes N large ((N-1)/N = 1).
    """
    if isinstance(flops_per_s, DeviceSpec):
        device = flops_per_s
        flops_per_s = device.flops_per_s
        link_bytes_per_s = device.link_bytes_per_s if link_bytes_per_s is None else link_bytes_per_s
    device = DeviceSpec("check", flops_per_s, link_bytes_per_s if link_bytes_per_s is not None else -1)
    if not bytes_per_param > 0:
        raise ValueError(f"bytes_per_param must be > 0, got {bytes_per_param!r}.")
    share = 1.0 if num_devices is None else (_ranks("num_devices", num_devices) - 1) / num_devices
    return bytes_per_param / 2 * device.flops_per_s / device.link_bytes_per_s * share

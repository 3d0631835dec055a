"""The plans a run could take, as :class:`~workbench.runs.spec.RunSpec` s, each priced by the models (issue 27).

:func:`enumerate_candidates` lists every runnable plan of one model on N ranks: each registered strategy the
framework runs (the records of :mod:`workbench.strategies`: DDP, the ZeRO-1/2-like ``fsdp-row`` and
``fsdp-flat``, ZeRO-3 ``fsdp-full`` resharding after forward, in JAX HSDP's ``hsdp-row`` (where the placement
gives replica groups: a shard group per host), and, in MLX, ``fully_shard`` keeping its units gathered to
backward), at every ``communication_size`` of the bucket-size advisor's sweep where the
strategy syncs by buckets (:func:`workbench.estimate.advisor.default_sizes`), and at every micro-batch x G that
makes the global batch, synced once per step or after every micro-batch. A plan the strategy cannot split the
model into is left out, with why. :func:`price_candidate` puts the peak per rank (the memory model with the
model's measured profile) and the step time (the profile, the strategy's collectives and the placement's
links) on one plan.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from workbench.core.buckets import plan_buckets
from workbench.core.shards import plan_shards
from workbench.core.specs import ModelSpec
from workbench.estimate.advisor import default_sizes
from workbench.runs.estimate import run_model_spec
from workbench.runs.profile import ModelProfile
from workbench.runs.profile_estimate import estimate_with_profile
from workbench.runs.spec import RunSpec, splits_into_groups
from workbench.strategies import get_strategy, strategies


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One plan and what the models predict of it, per rank.

    Attributes:
        spec: The run it would be.
        predicted_peak_bytes: The memory model's peak per rank, with the profile's activations.
        fits: The peak plus the safety margin is within the budget (``peak * (1 + margin) <= memory``).
        headroom_bytes: The budget less the peak (negative: over it).
        step: The predicted step by term (:class:`~workbench.estimate.step_time.StepTimePrediction`).
        tokens_per_s: Tokens the N ranks train per second at the predicted step time.
        flat_padding: The flat layout's padding, as a fraction of the model's bytes (0 for other layouts).
        rank: 1 for the recommendation; fitting plans first by step time, then the rest by peak.
        reason: Why it ranks where it does, in one line.
    """

    spec: RunSpec
    predicted_peak_bytes: int
    fits: bool
    headroom_bytes: int
    step: Any
    tokens_per_s: float
    flat_padding: float = 0.0
    rank: int = 0
    reason: str = ""

    @property
    def predicted_step_s(self) -> float:
        return self.step.total_s

    @property
    def label(self) -> str:
        """``fsdp-row, 4 MiB, b=4 x G=2 deferred``: what sets this plan apart."""
        return plan_label(self.spec)

    def to_dict(self) -> dict:
        """The fields other tools read (the ``--json`` of ``python -m workbench plan``)."""
        s = self.spec
        return {"strategy": s.strategy, "layout": get_strategy(s.strategy).layout, "num_replicas": s.num_replicas,
                "communication_size": s.communication_size, "micro_batch_size": s.micro_batch_size,
                "num_microbatches": s.num_microbatches, "defer_sync": s.defer_sync,
                "predicted_peak_bytes": self.predicted_peak_bytes, "predicted_step_s": self.predicted_step_s,
                "fits": self.fits, "headroom_bytes": self.headroom_bytes, "tokens_per_s": self.tokens_per_s,
                "predicted_terms_s": self.step.to_dict(), "flat_padding": self.flat_padding, "rank": self.rank,
                "reason": self.reason, "label": self.label, "spec": s.to_dict()}


def plan_label(spec: RunSpec) -> str:
    size = spec.communication_size
    text = f"{size // 2**20} MiB" if size % 2**20 == 0 else f"{size // 2**10} KiB"
    if get_strategy(spec.strategy).units != "buckets":
        text = "per unit"
    sync = "" if spec.num_microbatches == 1 else " deferred" if spec.defer_sync else " every micro-batch"
    groups = f" ({spec.num_replicas} replicas of {spec.shard_group_size})" if spec.num_replicas > 1 else ""
    return f"{spec.strategy}{groups}, {text}, b={spec.micro_batch_size} x G={spec.num_microbatches}{sync}"


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def sizes_that_differ(model: ModelSpec, sizes: tuple[int, ...]) -> tuple[int, ...]:
    """``sizes`` less those whose bucket plan is that of a smaller size (two sizes, one plan: one candidate)."""
    kept, seen = [], set()
    for size in sorted(set(sizes)):
        plan = tuple(plan_buckets(model, size).offsets.tolist())
        if plan not in seen:
            seen.add(plan)
            kept.append(size)
    return tuple(kept)


def enumerate_candidates(base: RunSpec, model: ModelSpec, *, sizes: tuple[int, ...] | None = None,
                         replicas: tuple[int, ...] = ()) -> tuple[list[RunSpec], list[tuple[str, str]]]:
    """Every plan of ``base``'s model, ranks, global batch and framework the framework can run.

    Args:
        base: The run as asked (its strategy, ``communication_size``, G and ``defer_sync`` are varied).
        model: Its parameters (:func:`~workbench.runs.estimate.run_model_spec`).
        sizes: ``communication_size`` s to try, bytes (default: the advisor's sweep,
            :func:`~workbench.estimate.advisor.default_sizes`, less sizes giving the same buckets).
        replicas: Replica groups R to try for a strategy that replicates shard groups (HSDP; R dividing the ranks
            into groups of 2 or more); none tries no such strategy.

    Returns:
        The plans, and ``(plan, why)`` for each one left out because the strategy cannot split the model.
    """
    sizes = sizes_that_differ(model, tuple(sizes) if sizes is not None else default_sizes(model))
    per_rank = base.global_batch // base.num_ranks
    specs, left_out = [], []
    for record in strategies():
        if base.framework not in record.frameworks:
            continue
        impl = record.implementation(base.framework)
        by_size = record.units == "buckets" and impl.sync_per == "bucket"
        groups = [r for r in replicas if splits_into_groups(base.num_ranks, r)] if record.replicas else [1]
        for r, size in ((r, size) for r in groups for size in (sizes if by_size else (base.communication_size,))):
            for g in divisors(per_rank):
                for defer in (True,) if g == 1 else (True, False):
                    if defer and g > 1 and not impl.defers_sync:
                        continue
                    try:
                        if base.num_ranks > 1:
                            record.check_model(model, base.num_ranks // r, size)
                        specs.append(replace(base, strategy=record.name, communication_size=size,
                                             num_microbatches=g, defer_sync=defer, num_replicas=r))
                    except ValueError as err:
                        left_out.append((f"{record.name}, {size} B, G={g}", str(err)))
    return specs, left_out


def flat_padding(spec: RunSpec, model: ModelSpec) -> float:
    """The worst rank's padding of the flat layout, as a fraction of its share of the model (0 elsewhere)."""
    record = get_strategy(spec.strategy)
    n = spec.shard_group_size
    if record.layout != "flat" or record.units != "buckets" or n < 2:
        return 0.0
    plan = plan_shards(plan_buckets(model, spec.communication_size), n, "flat")
    return float(max(plan.rank_padding_bytes)) / max(1.0, model.nbytes / n)


def price_candidate(spec: RunSpec, profile: ModelProfile, model: ModelSpec, *, memory_bytes: int,
                    safety_margin: float, predict_step: Callable[[RunSpec], Any]) -> Candidate:
    """One plan priced: the peak per rank from the memory model with the profile's activations, whether it fits
    with ``safety_margin``, and the step from ``predict_step(spec)``."""
    shapes = model if spec.model_factory is not None else None
    peak = estimate_with_profile(spec, profile, shapes).total_bytes
    step = predict_step(spec)
    tokens = spec.global_batch * spec.model["seq_len"]
    return Candidate(spec=spec, predicted_peak_bytes=int(peak), fits=peak * (1 + safety_margin) <= memory_bytes,
                     headroom_bytes=int(memory_bytes - peak), step=step,
                     tokens_per_s=tokens / step.total_s if step.total_s > 0 else float("inf"),
                     flat_padding=flat_padding(spec, model))


def model_of(spec: RunSpec, model_shapes: Any = None) -> ModelSpec:
    """The run's parameters (a user model's from ``model_shapes``, see :func:`~workbench.runs.estimate.run_model_spec`)."""
    return run_model_spec(spec, model_shapes)

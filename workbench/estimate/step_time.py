"""A training step's seconds predicted from a model's measured profile (issue 26).

One optimizer step of a rank is, with nothing overlapping (the trainers evaluate each micro-batch's
backward before its sync starts, and update after it):

* **compute**: forward and backward of G micro-batches, each the profile's measured seconds at the run's
  micro-batch size (measured on one process with the threads a rank gets), plus the forward again where the
  step recomputes its units in backward (ZeRO-3 resharding after forward);
* **update**: the optimizer's update of what this rank updates: the profile's seconds per parameter byte
  times the bytes of the rank's shard (all the parameters where the optimizer is not sharded);
* **collectives**: what the strategy record issues for G micro-batches (synced once or after each,
  :meth:`~workbench.strategies.Strategy.step_collectives`), each kind priced by the placement's fitted
  alpha-beta link (:class:`~workbench.estimate.comm.AlphaBeta`: ``alpha * ring steps + bytes / beta``);
* **per bucket**: the seconds each synced bucket costs beyond its collectives' latency (packing, dispatch:
  the bucket-size advisor's ``per_bucket_s``, :func:`~workbench.estimate.advisor.predict_sync_curve`), times
  the buckets synced in a step;
* **overhead**: what the trainer's step spends beyond the bare forward and backward and the optimizer's update:
  its evaluation barriers, tree maps, the global norm, the update's call structure, Python. Measured, not
  fitted: the profile times the real trainer's step on a group of one beside the bare parts
  (:attr:`~workbench.runs.profile.ModelProfile.step_overhead_s`); once per step, whatever G.

Compute, update and overhead are CPU work: where the ranks on a host ask for more threads than it has cores,
each runs ``slowdown = ranks * threads / cores`` times slower than one process alone (:func:`cpu_slowdown`). A
profile measured with that many processes at once (its ``co_runners``) already holds the contention it met:
the run's slowdown is then relative to the profile's (:func:`relative_slowdown`).

Pure: standard library only, and the layers below (the run's side: :func:`workbench.runs.estimate.predict_run_step_time`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable, Mapping

from workbench.estimate.advisor import links_by_kind
from workbench.estimate.comm import AlphaBeta
from workbench.strategies import Collective, ring_steps

#: The terms of a prediction, in the order a step spends them; a validation names the one that is off.
TERMS = ("compute", "update", "collectives", "per_bucket", "overhead")


@dataclass(frozen=True, kw_only=True)
class StepTimePrediction:
    """Seconds of one optimizer step of one rank, by term (nothing overlaps: the total is their sum).

    Attributes:
        compute_s: Forward and backward of the step's G micro-batches.
        update_s: The optimizer's update of this rank's parameters (its shard where sharded).
        comm_s: The step's collectives, priced by the fitted links.
        per_bucket_s: The synced buckets' fixed cost beyond their collectives (per bucket times buckets).
        overhead_s: The trainer's step beyond forward, backward and update (measured by the profile; 0 where
            the profile has none).
        comm_by_kind: ``comm_s`` by collective kind (seconds).
        num_collectives: Collectives the step issues (all kinds).
    """

    compute_s: float
    update_s: float
    comm_s: float
    per_bucket_s: float
    overhead_s: float = 0.0
    comm_by_kind: Mapping[str, float] | None = None
    num_collectives: int = 0

    @property
    def total_s(self) -> float:
        """The step: the sum of the terms, in seconds."""
        return self.compute_s + self.update_s + self.comm_s + self.per_bucket_s + self.overhead_s

    @property
    def after_backward_s(self) -> float:
        """The terms after the forward and backward (collectives, per bucket, update, overhead): what MLX's ranks
        time apart as ``sync_time_s``."""
        return self.total_s - self.compute_s

    def term_s(self, term: str) -> float:
        """Seconds of one of :data:`TERMS`."""
        if term not in TERMS:
            raise ValueError(f"term {term!r}: one of {', '.join(TERMS)}")
        return {"compute": self.compute_s, "update": self.update_s, "collectives": self.comm_s,
                "per_bucket": self.per_bucket_s, "overhead": self.overhead_s}[term]

    def to_dict(self) -> dict:
        """The terms and ``total_s`` (seconds), the collectives by kind and their count."""
        out = asdict(self)
        out["comm_by_kind"] = dict(self.comm_by_kind or {})
        out["total_s"] = self.total_s
        return out


def _nonnegative(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name}={value!r}: a finite number >= 0")
    return float(value)


def _count(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}={value!r}: an integer >= {low}")
    return value


def rank_update_bytes(parameter_bytes: int, num_ranks: int, sharded_optimizer: bool) -> int:
    """Bytes of parameters one rank's optimizer updates: all of them, or its shard (``ceil(P / N)``: the shard
    plans pad the last rows, so the largest shard sets the step)."""
    p, n = _count("parameter_bytes", parameter_bytes, 0), _count("num_ranks", num_ranks, 1)
    return -(-p // n) if sharded_optimizer else p


def cpu_slowdown(ranks_per_host: int, threads: int | None, cores: int | None) -> float:
    """How much slower a rank computes than the profile did alone: ``ranks * threads / cores`` where that is
    over 1 (the ranks share the cores), else 1; 1 where threads or cores are unknown."""
    n = _count("ranks_per_host", ranks_per_host, 1)
    known = all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (threads, cores))
    return max(1.0, n * threads / cores) if known else 1.0


def relative_slowdown(ranks_per_host: int, threads: int | None, cores: int | None, co_runners: int = 1) -> float:
    """How much slower a rank computes than a profile measured with ``co_runners`` processes at once (each with
    ``threads`` threads on ``cores`` cores): ``cpu_slowdown(ranks) / cpu_slowdown(co_runners)``; below 1 where the
    run has fewer ranks per host than the profile had processes."""
    return cpu_slowdown(ranks_per_host, threads, cores) / cpu_slowdown(_count("co_runners", co_runners, 1), threads, cores)


def collective_seconds(collectives: Iterable[Collective], links: Mapping, framework: str | None = None
                       ) -> dict[str, float]:
    """Seconds of ``collectives`` by kind, each ``count`` collectives of ``data_bytes`` in all over their group:
    ``alpha * count * ring steps + bytes sent per rank / beta``.

    Args:
        collectives: :meth:`~workbench.strategies.Strategy.step_collectives` of a step.
        links: ``{kind: AlphaBeta}``, or ``fit_links``' ``{(framework, kind): AlphaBeta}`` (read for ``framework``).
        framework: Which framework's links to read from a ``(framework, kind)`` mapping.

    Raises:
        ValueError: a collective kind with no fitted link, naming it.
    """
    by_kind: dict[str, AlphaBeta] = links_by_kind(links, framework or "")
    out: dict[str, float] = {}
    for c in collectives:
        if c.count == 0 or c.group_size < 2:
            continue
        if c.kind not in by_kind:
            where = f"{framework} " if framework else ""
            raise ValueError(f"no fitted link for {where}{c.kind}: run the collective benchmark of this placement "
                             f"(workbench.launch.benchmark) for it; links hold {sorted(by_kind) or 'none'}")
        steps = c.count * ring_steps(c.kind, c.group_size)
        out[c.kind] = out.get(c.kind, 0.0) + float(by_kind[c.kind].predict_s(c.rank_bytes, steps))
    return out


def predict_step_time(*, compute_s_per_microbatch: float, num_microbatches: int, update_s_per_param_byte: float,
                      update_param_bytes: int, collectives: Iterable[Collective] = (), links: Mapping | None = None,
                      framework: str | None = None, buckets_synced: int = 0, per_bucket_s: float = 0.0,
                      recompute_s_per_microbatch: float = 0.0, slowdown: float = 1.0,
                      step_overhead_s: float = 0.0) -> StepTimePrediction:
    """One rank's optimizer step, in seconds, by term (see the module docstring).

    Args:
        compute_s_per_microbatch: Forward and backward of one micro-batch (the profile's, at the run's size), s.
        num_microbatches: G, micro-batches per step (>= 1).
        update_s_per_param_byte: The optimizer's update, seconds per byte of parameters updated (the profile's).
        update_param_bytes: Bytes of parameters this rank updates (:func:`rank_update_bytes`).
        collectives: The step's collectives (the strategy record's, for G and ``defer_sync``).
        links: Fitted links by kind (see :func:`collective_seconds`); needed when ``collectives`` has any.
        framework: Which framework's links to read from a ``(framework, kind)`` mapping.
        buckets_synced: Buckets synced in a step (buckets per sync times syncs; 0 where nothing syncs by buckets).
        per_bucket_s: Seconds each synced bucket costs beyond its collectives (>= 0).
        recompute_s_per_microbatch: Forward seconds a micro-batch's backward runs again (the profile's forward
            where the units reshard after forward; else 0).
        slowdown: Compute, update and overhead run this many times slower than profiled (> 0;
            :func:`relative_slowdown`).
        step_overhead_s: The trainer's step beyond forward, backward and update, once per step (the profile's).

    Raises:
        ValueError: a negative or non-finite number, G < 1, slowdown <= 0, or a collective with no link (each named).
    """
    compute = _nonnegative("compute_s_per_microbatch", compute_s_per_microbatch)
    compute += _nonnegative("recompute_s_per_microbatch", recompute_s_per_microbatch)
    slow = _nonnegative("slowdown", slowdown)
    if slow <= 0:
        raise ValueError(f"slowdown={slowdown!r}: > 0 (how much slower than profiled a rank computes)")
    overhead = _nonnegative("step_overhead_s", step_overhead_s)
    g = _count("num_microbatches", num_microbatches, 1)
    rate = _nonnegative("update_s_per_param_byte", update_s_per_param_byte)
    nbytes = _count("update_param_bytes", update_param_bytes, 0)
    buckets, per_bucket = _count("buckets_synced", buckets_synced, 0), _nonnegative("per_bucket_s", per_bucket_s)
    collectives = tuple(collectives)
    priced = [c for c in collectives if c.count and c.group_size > 1]
    if priced and links is None:
        raise ValueError("links=None: the step has collectives to price; give the placement's fitted links "
                         "(workbench.studies.step_time.fit_links of its collective benchmark)")
    by_kind = collective_seconds(priced, links or {}, framework)
    return StepTimePrediction(compute_s=compute * g * slow, update_s=rate * nbytes * slow, comm_s=sum(by_kind.values()),
                              per_bucket_s=per_bucket * buckets, overhead_s=overhead * slow, comm_by_kind=by_kind,
                              num_collectives=sum(c.count for c in priced))


#: Where a run's measured step is held to its prediction (on a quiet machine: under load, ranks wait on each other).
STEP_TIME_TOLERANCE = 0.10


def off_term(prediction: StepTimePrediction, measured_s: float, measured_sync_s: float | None = None, *,
             tolerance: float = STEP_TIME_TOLERANCE, comm_at_mean_s: float | None = None) -> tuple[str | None, str]:
    """The term of ``prediction`` that is off where the measured step misses it by more than ``tolerance``.

    Where the run measured its sync apart (MLX's bucketed steps: ``sync_time_s``, everything after the forward and
    backward), the side that misses more is found first: that part (collectives, per bucket, update, overhead) or
    the forward and backward (compute). On that side (or
    among all the terms, without a measured sync) the term named is the largest predicted one: the one that would need
    the smallest relative correction to close the gap. Without a measured sync (a JAX step is one program), the
    collectives are named first where pricing them at their calls' mean (``comm_at_mean_s``: links fitted to the
    benchmark's means, :func:`workbench.studies.step_time.fit_links`) rather than median closes half the gap or more:
    calls that stall, which the median leaves out and a step pays.

    Returns:
        ``(term, why)``: a name of :data:`TERMS` (None when within), and a sentence with the figures (ms).
    """
    predicted, measured = prediction.total_s, _nonnegative("measured_s", measured_s)
    gap = measured - predicted
    if predicted > 0 and abs(gap) <= tolerance * predicted:
        return None, f"within {tolerance:.0%}: measured {measured * 1e3:.1f} ms, predicted {predicted * 1e3:.1f} ms"
    side, detail = TERMS, ""
    if measured_sync_s is not None:
        sync = _nonnegative("measured_sync_s", measured_sync_s)
        rest_pred, sync_pred = prediction.compute_s, prediction.after_backward_s
        rest_gap = (measured - sync) - rest_pred
        side = ("collectives", "per_bucket", "update", "overhead") if abs(sync - sync_pred) > abs(rest_gap) \
            else ("compute",)
        detail = (f"; after the backward (sync, update) measured {sync * 1e3:.1f} ms against {sync_pred * 1e3:.1f} "
                  f"predicted, the forward and backward {(measured - sync) * 1e3:.1f} against {rest_pred * 1e3:.1f}")
    elif comm_at_mean_s is not None:
        at_mean = predicted - prediction.comm_s + _nonnegative("comm_at_mean_s", comm_at_mean_s)
        if abs(measured - at_mean) <= abs(gap) / 2:
            return "collectives", (f"measured {measured * 1e3:.1f} ms against {predicted * 1e3:.1f} predicted "
                                   f"({gap * 1e3:+.1f} ms): collectives predicted {prediction.comm_s * 1e3:.1f} ms at "
                                   f"their calls' median, {comm_at_mean_s * 1e3:.1f} ms at their mean (calls that "
                                   f"stall), which predicts {at_mean * 1e3:.1f} ms")
    term = max(side, key=prediction.term_s)
    return term, (f"measured {measured * 1e3:.1f} ms against {predicted * 1e3:.1f} predicted ({gap * 1e3:+.1f} ms)"
                  f"{detail}: {term} predicted {prediction.term_s(term) * 1e3:.1f} ms")

"""The memory model for a run: the estimate made from the same spec the ranks trained.

:func:`estimate_run_memory` turns a :class:`~workbench.runs.spec.RunSpec` into the :func:`~workbench.estimate.memory.estimate_memory`
call that describes it: the LM's parameter shapes, the strategy, precision and optimizer, the bucket and shard
plans of its ``communication_size`` over its shard group, activations, and what the framework's step writes beside the arrays it updates
(:meth:`~workbench.strategies.Strategy.update_copies`: MLX's new parameter tree, and its resident FSDP's master shards; a
jitted JAX step's new parameters and optimizer state, none where donated). :mod:`workbench.studies.memory` sets it
beside what the ranks measured; :func:`predict_run_step_time` its step time.
"""

from __future__ import annotations

from typing import Any, Mapping

from workbench.core.buckets import plan_buckets
from workbench.core.fully_shard_plan import ROOT, plan_fully_shard
from workbench.core.shards import plan_shards
from workbench.core.specs import DTYPE_BYTES, ModelSpec, spec_from_flat
from workbench.estimate.activations import estimate_activation_bytes
from workbench.estimate.breakdown import MemoryEstimate
from workbench.estimate.memory import estimate_memory
from workbench.estimate.step_time import (STEP_TIME_TOLERANCE, StepTimePrediction, off_term, predict_step_time,
                                          rank_update_bytes, relative_slowdown)
from workbench.models.init import LMConfig, lm_model_spec
from workbench.runs.spec import shard_groups
from workbench.strategies import StepShape, get_strategy


def run_model_spec(spec: Any, model_shapes: Any = None) -> ModelSpec:
    """The parameter shapes of a run's model, in its precision (``spec``: a RunSpec or its dict).

    A user's model (``model_factory``) has no shapes in its spec: give ``model_shapes``, the
    ``[[path, shape, dtype], ...]`` the driver stored in the run's record (``record["model_shapes"]``)
    (:func:`workbench.ranks.user_model.user_model_spec`), or a :class:`ModelSpec`.
    """
    fields = spec if isinstance(spec, Mapping) else spec.to_dict()
    if isinstance(model_shapes, ModelSpec):
        return model_shapes
    if fields.get("model_factory") is not None:
        if model_shapes is None:
            raise ValueError(f"the run of model_factory={fields['model_factory']!r} needs its model's shapes: "
                             "workbench.ranks.user_model.user_model_spec(spec), or the record's 'model_shapes'")
        return spec_from_flat([(path, shape, fields["precision"]) for path, shape, _ in model_shapes],
                              fields["model_factory"])
    return lm_model_spec(LMConfig(**fields["model"]), fields["precision"])


def estimate_run_activation_bytes(config: LMConfig, micro_batch_size: int, dtype: str, *,
                                  recompute: bool = False) -> int:
    """Activations of the LM for backward: Korthikanti et al.'s per-layer term at this dtype, plus the
    fp32 logits and their softmax (``2 * s * b * V * 4``), which that formula leaves out.

    Korthikanti's 34 assumes 16-bit activations; it is scaled by ``bytes(dtype) / 2``.
    ``recompute``: every block is rematerialised in backward (the fsdp-full units with
    ``reshard_after_forward``: MLX's ``ShardedUnit`` re-runs the block, JAX's ``jax.checkpoint``
    per unit), so only the block boundaries are kept, ``(L + 1) * s * b * h * bytes(dtype)`` (each
    block's input and the last block's output), plus one block's internals during its recompute
    (Korthikanti's term for one layer), plus the logits.
    """
    s, b, h, nbytes = config.seq_len, micro_batch_size, config.dim, DTYPE_BYTES[dtype]
    layers = estimate_activation_bytes(seq_len=s, micro_batch_size=b, hidden_size=h, num_heads=config.num_heads,
                                       num_layers=1 if recompute else config.num_layers) * nbytes // 2
    if recompute:
        layers += (config.num_layers + 1) * s * b * h * nbytes
    return layers + 2 * s * b * config.vocab_size * 4


def estimate_user_activation_bytes(seq_len: int, micro_batch_size: int, vocab_size: int) -> int:
    """Activations of a user's model for backward, as far as the workbench can know them from its spec:
    the fp32 logits and their softmax, ``2 * s * b * V * 4`` (the model's inner activations are its own)."""
    return 2 * seq_len * micro_batch_size * vocab_size * 4


def estimate_run_memory(spec: Any, model_shapes: Any = None) -> MemoryEstimate:
    """Per-rank memory estimate of a run (a :class:`~workbench.runs.spec.RunSpec` or its dict).

    ``model_shapes``: a user model's parameters (:func:`run_model_spec`); ignored for the built-in LM, whose
    activations are the closed formula's (a user model's: :func:`estimate_user_activation_bytes`).

    The bucket plan is MLX's rule at ``communication_size`` (the JAX FSDP step uses the same plan). With
    ``num_microbatches`` G > 1, activations are one micro-batch's and the accumulator follows ``defer_sync``
    (:func:`~workbench.estimate.memory.estimate_memory`). ``fsdp-full`` (ZeRO-3) and MLX's ``fully_shard`` gather
    units: each transformer block (a ``layers``, ``blocks`` or ``h`` entry, a user model's too), then the root
    (:func:`~workbench.core.fully_shard_plan.plan_fully_shard`). MLX's ``fsdp-full`` recomputes each block in
    backward (:func:`units_recomputed`), its unit's backward buffers ``ShardedUnit``'s (``unit_buffers="mlx"``);
    JAX's holds every unit gathered at once, its activations whole (``unit_buffers="whole_model"``);
    ``fully_shard`` keeps every unit gathered from forward to backward, nothing recomputed. A run gathers in its
    ``precision`` (a RunSpec has no ``compute_dtype``), so no cast copies are counted.
    """
    fields = spec if isinstance(spec, Mapping) else spec.to_dict()
    (n, replicas), strategy, precision = shard_groups(fields), fields["strategy"], fields["precision"]
    record = get_strategy(strategy)  # an unknown name lists the registered ones
    g = fields.get("num_microbatches", 1)
    model = run_model_spec(fields, model_shapes)
    buckets = plan_buckets(model, fields["communication_size"])
    by_buckets = record.units == "buckets"  # else the units are modules: no bucket plan, no shards of buckets
    shard_plan = plan_shards(buckets, n, record.layout) if by_buckets and record.layout else None
    impl = record.implementation_in(fields["framework"])
    # the units MLX's trainers wrap (each block, then the root; ranks.user_model.block_units): fully_shard keeps
    # every unit's weights gathered from forward to backward, ZeRO-3 the largest unit's buffers in backward
    units = {u.name: u.num_params for u in plan_fully_shard(model, n).units} if record.family == "fully_shard" or (
        record.gathers_units and fields["framework"] == "mlx") else None
    return estimate_memory(
        model, strategy, n, num_replicas=replicas, param_dtype=precision, master_dtype=None, optimizer=fields["optimizer"],
        optimizer_state_dtype=precision, bucket_plan=buckets if by_buckets else None,
        shard_plan=shard_plan, update_copies=record.update_copies(fields["framework"]),
        num_microbatches=g, defer_sync=fields.get("defer_sync", True), reshard_after_forward=record.reshard_after_forward,
        units=units, unit_buffers=impl.unit_buffers if impl is not None else "parameters_and_gradients",
        sync_in_place=impl is not None and impl.sync_per == "array",  # JAX's DDP: one psum per array, in place
        collective_scratch=impl.collective_scratch if impl is not None else 0.0,
        activation_bytes=_activation_bytes(fields, fields["global_batch"] // (fields["num_ranks"] * g), units_recomputed(fields)))


def units_recomputed(fields: Mapping[str, Any], *, memory: bool = True) -> bool:
    """Whether a run's backward recomputes its units' forward: a strategy resharding them after forward, unless
    deferred sync (G > 1) runs the gathered model whole. ``memory``: and keeps fewer activations for it, which
    JAX's ZeRO-3 does not (``unit_buffers="whole_model"``: XLA gathers every unit at once, so its jax.checkpoint
    saves nothing at the peak: on the validation LM at 2 ranks XLA's plan was 66.3 MiB and VmHWM 77.5 MiB, where
    per-unit gathers with recomputed blocks predicted 45.6 MiB, and the whole model gathered 61.8 MiB)."""
    record = get_strategy(fields["strategy"])
    impl = record.implementation_in(fields["framework"])
    deferred = fields.get("num_microbatches", 1) > 1 and fields.get("defer_sync", True)
    return record.gathers_units and record.reshard_after_forward and not deferred and not (
        memory and impl is not None and impl.unit_buffers == "whole_model")


def _activation_bytes(fields: Mapping[str, Any], micro_batch_size: int, recompute: bool) -> int:
    if fields.get("model_factory") is not None:
        return estimate_user_activation_bytes(fields["model"]["seq_len"], micro_batch_size, fields["model"]["vocab_size"])
    return estimate_run_activation_bytes(LMConfig(**fields["model"]), micro_batch_size, fields["precision"],
                                         recompute=recompute)


def spec_from_row(run: Mapping[str, Any]) -> dict:
    """A run's spec dict back from a row of ``load_runs(...).runs`` (flattened ``spec.*`` columns;
    pandas turns integers into floats where a column has gaps, so integral floats become ints, and
    a gap (NaN: a field this run's stored spec leaves at its default) is left out)."""
    def plain(v: Any) -> Any:
        v = v.item() if hasattr(v, "item") else v
        return int(v) if isinstance(v, float) and v.is_integer() else v

    spec: dict = {"model": {}}
    for key, value in run.items():
        if isinstance(value, float) and value != value:  # NaN: not in this run's spec
            continue
        if key.startswith("spec.model."):
            spec["model"][key[len("spec.model."):]] = plain(value)
        elif key.startswith("spec."):
            spec[key[len("spec."):]] = plain(value)
    return spec




def _unit_bytes(fields: Mapping[str, Any], model: ModelSpec) -> tuple[tuple[float, bool], ...]:
    """A unit-gathering run's units in forward order: (bytes, gathered again in backward). MLX wraps each block,
    then the root; JAX chains the embeddings, each block, then the norm and head (one unit where the embeddings
    are tied, or for a user's model), every unit regathered in backward (``jax.checkpoint`` per unit)."""
    record = get_strategy(fields["strategy"])
    if fields["framework"] == "mlx":
        return tuple((float(u.param_bytes), record.reshard_after_forward and u.name != ROOT)
                     for u in plan_fully_shard(model, fields["num_ranks"]).units)
    if fields.get("model_factory") is not None or fields["model"].get("tie_embeddings"):
        return ((float(model.nbytes), True),)
    groups: dict[str, float] = {}
    for p in model:
        parts = p.path.split(".")
        key = ".".join(parts[:2]) if parts[0] == "layers" else ("embed" if "embed" in parts[0] else "head")
        groups[key] = groups.get(key, 0.0) + p.nbytes
    order = ["embed", *(k for k in groups if k.startswith("layers.")), "head"]
    return tuple((groups[k], True) for k in order if k in groups)


def run_step_shape(spec: Any, model_shapes: Any = None) -> StepShape:
    """What one optimizer step of a run syncs and gathers, for its strategy record: the buckets of ``communication_size``
    (JAX's DDP: each array; a unit-gathering strategy: its units) over its shard group (and HSDP's replicas), G and
    ``defer_sync``, and whether the step all-reduces the gradient norm (MLX always; JAX where ``max_norm`` is set).
    ``spec``: a RunSpec or its dict; ``model_shapes`` as :func:`run_model_spec`."""
    fields = spec if isinstance(spec, Mapping) else spec.to_dict()
    record, (n, replicas) = get_strategy(fields["strategy"]), shard_groups(fields)
    impl = record.implementation(fields["framework"])
    model = run_model_spec(fields, model_shapes)
    units = _unit_bytes(fields, model) if record.gathers_units else None
    if impl.sync_per == "array":
        sync = tuple(float(p.nbytes) for p in model)
    elif units is not None:
        sync = tuple(b for b, _ in units)
    else:
        buckets = plan_buckets(model, fields["communication_size"])
        plan = plan_shards(buckets, n, record.layout) if record.layout else None
        sync = tuple(float(b) for b in (buckets.bucket_bytes if plan is None else
                                        plan.bucket_chunk_elems * plan.num_shards * buckets.bucket_itemsize))
    return StepShape(num_ranks=n, sync_bytes=sync, units=units, num_replicas=replicas,
                     num_microbatches=fields.get("num_microbatches", 1), defer_sync=fields.get("defer_sync", True),
                     reduces_norm=impl.reduces_norm(fields.get("max_norm") is not None))


def predict_run_step_time(spec: Any, profile: Any, links: Mapping, *, model_shapes: Any = None,
                          per_bucket_s: float = 0.0, ranks_per_host: int | None = None) -> StepTimePrediction:
    """One rank's optimizer step of a run, in seconds by term, from its model's measured profile.

    The advisor's call: ``predict_run_step_time(spec, profile, links)``.

    Args:
        spec: A :class:`~workbench.runs.spec.RunSpec` or its dict: ``framework``, ``strategy``, ``num_ranks``,
            ``global_batch`` and ``num_microbatches`` G (the micro-batch is ``global_batch // (N * G)``
            sequences), ``communication_size``, ``defer_sync``, ``max_norm``, the model.
        profile: The model's :class:`~workbench.runs.profile.ModelProfile`
            (:func:`workbench.launch.profile.profile_model` of the same spec: measured with the threads a
            rank of this run gets). Its compute line gives each micro-batch's forward and backward seconds
            (and its forward line what a step resharding its units after forward runs again in backward),
            its update seconds per parameter byte the update of this rank's shard, and its timed trainer step
            the step's overhead beyond those (:attr:`~workbench.runs.profile.ModelProfile.step_overhead_s`).
        links: The placement's fitted links, ``{(framework, kind): AlphaBeta}``
            (:func:`workbench.studies.step_time.fit_links` of its collective benchmark) or ``{kind: AlphaBeta}``.
        model_shapes: A user model's parameters (:func:`run_model_spec`); ignored for the built-in LM.
        per_bucket_s: Seconds each synced bucket costs beyond its collectives (the bucket-size advisor's).
        ranks_per_host: Ranks sharing a host (default ``num_ranks``: one machine). Where they ask for more
            threads than its cores, compute, update and overhead slow down, relative to the profile's
            processes at once (its ``co_runners``: :func:`~workbench.estimate.step_time.relative_slowdown`).

    Returns:
        :class:`~workbench.estimate.step_time.StepTimePrediction`: compute (G micro-batches), update, collectives
        (the record's for G and ``defer_sync`` as compiled: :meth:`~workbench.strategies.Strategy.compiled_collectives`),
        per-bucket and overhead seconds.

    Raises:
        ValueError: the profile is of another model, precision, sequence length or framework, or a collective
            of the step has no fitted link (each named).
    """
    fields = spec if isinstance(spec, Mapping) else spec.to_dict()
    _check_profile_fits(fields, profile)
    record = get_strategy(fields["strategy"])
    n, g = fields["num_ranks"], fields.get("num_microbatches", 1)
    shape = run_step_shape(fields, model_shapes)
    model = run_model_spec(fields, model_shapes)
    by_buckets = record.units == "buckets" and record.implementation(fields["framework"]).sync_per == "bucket"
    b = fields["global_batch"] // (n * g)
    recompute = units_recomputed(fields, memory=False)  # JAX's units too: their forward runs again, held or not
    slowdown = relative_slowdown(ranks_per_host or n, profile.key_fields.get("threads"), getattr(profile, "cores", None),
                                 getattr(profile, "co_runners", 1))
    return predict_step_time(
        compute_s_per_microbatch=profile.compute_s_at(b), num_microbatches=g, slowdown=slowdown,
        recompute_s_per_microbatch=profile.forward_s_at(b) if recompute else 0.0,
        update_s_per_param_byte=profile.update_s_per_param_byte,
        update_param_bytes=rank_update_bytes(model.nbytes, shape.num_ranks, record.sharded.optimizer),
        collectives=record.compiled_collectives(shape, fields["framework"]), links=links, framework=fields["framework"],
        buckets_synced=len(shape.sync_bytes) * shape.syncs if by_buckets and n > 1 else 0, per_bucket_s=per_bucket_s,
        step_overhead_s=getattr(profile, "step_overhead_s", None) or 0.0)


def _check_profile_fits(fields: Mapping[str, Any], profile: Any) -> None:
    """A ValueError naming each field where ``profile`` measured another model than the run's."""
    key = profile.key_fields
    model = ({"factory": fields["model_factory"], "source_sha256": fields.get("model_source_sha256")}
             if fields.get("model_factory") is not None else {"lm": dict(fields["model"])})
    want = {"framework": fields["framework"], "precision": fields["precision"], "model": model, "seq_len": fields["model"]["seq_len"]}
    wrong = [f"{name}: {key.get(name)!r}, not {value!r}" for name, value in want.items() if key.get(name) != value]
    if wrong:
        raise ValueError(f"the profile {profile.key} measured another model than this run ({'; '.join(wrong)})")


def step_time_validation(loaded: Any, profile_of: Any, links: Mapping, *, per_bucket_s: float = 0.0,
                         warmup_steps: int = 1, tolerance: float = STEP_TIME_TOLERANCE, mean_links: Any = None) -> "Any":
    """Every done run's step time, predicted from its model's profile and measured, side by side.

    Args:
        loaded: :func:`workbench.runs.tables.load_runs` of a run store.
        profile_of: The profile of a run's model: a callable taking the run's spec dict (e.g.
            ``lambda s: profile_model(RunSpec(**s), root)``), or one profile for every run.
        links: The placement's fitted links (:func:`predict_run_step_time`), or a callable taking the run's spec
            dict and giving them (the links of its rank count: ``fit_links(table, num_ranks=...)``).
        per_bucket_s: Seconds per synced bucket beyond its collectives (the bucket-size advisor's).
        warmup_steps: Steps left out before the median.
        tolerance: The target, relative to the prediction (held on a quiet machine).
        mean_links: Links fitted to the benchmark's mean per call (``fit_links(..., statistic="mean")``), as
            ``links`` (a callable may give None): a miss the collectives' stalled calls explain is named theirs.

    Returns:
        A DataFrame, one row per run: ``run``, ``run_id``, ``framework``, ``strategy``, ``num_ranks``,
        ``num_microbatches``, the
        predicted terms and total (``compute_ms``, ``update_ms``, ``comm_ms``, ``per_bucket_ms``,
        ``overhead_ms``, ``predicted_ms``), ``measured_ms`` (median over steps after ``warmup_steps`` of the
        slowest rank),
        ``measured_sync_ms`` (MLX's bucketed steps, median of the rank that waited least; else NaN),
        ``ratio`` (measured / predicted), ``comm_mean_ms`` (NaN without ``mean_links``),
        ``tolerance``, ``within``, and where it misses, ``off_term`` and ``why``
        (:func:`~workbench.estimate.step_time.off_term`).
    """
    import pandas as pd

    rows = []
    runs, steps = loaded.runs, loaded.steps
    for _, run in (runs[runs.status == "done"] if "status" in runs else runs.iloc[0:0]).iterrows():
        spec = spec_from_row(run)
        profile = profile_of(spec) if callable(profile_of) else profile_of
        fitted, means = (of(spec) if callable(of) else of for of in (links, mean_links))
        p = predict_run_step_time(spec, profile, fitted, model_shapes=run.get("model_shapes"), per_bucket_s=per_bucket_s)
        at_mean = None if means is None else predict_run_step_time(spec, profile, means, model_shapes=run.get(
            "model_shapes"), per_bucket_s=per_bucket_s)
        mine = steps[(steps.run_id == run.run_id) & (steps.step >= warmup_steps)]
        step_s = float(mine.groupby("step").step_time_s.max().median())
        sync = mine.sync_time_s if "sync_time_s" in mine and mine.sync_time_s.notna().any() else None
        # the rank that waited least for the others: its sync is the collectives' own time
        sync_s = None if sync is None else float(mine.assign(s=sync).groupby("step").s.min().median())
        term, why = off_term(p, step_s, sync_s, tolerance=tolerance, comm_at_mean_s=at_mean and at_mean.comm_s)
        rows.append({"run": f"{spec['framework']} {spec['strategy']}", "run_id": run.run_id,
                     "framework": spec["framework"], "strategy": spec["strategy"], "num_ranks": spec["num_ranks"],
                     "num_microbatches": spec.get("num_microbatches", 1),
                     **{f"{t}_ms": getattr(p, f"{t}_s") * 1e3 for t in ("compute", "update", "comm", "per_bucket",
                                                                         "overhead")},
                     "predicted_ms": p.total_s * 1e3, "measured_ms": step_s * 1e3,
                     "measured_sync_ms": float("nan") if sync_s is None else sync_s * 1e3,
                     "ratio": step_s / p.total_s if p.total_s else float("nan"),
                     "comm_mean_ms": float("nan") if at_mean is None else at_mean.comm_s * 1e3, "tolerance": tolerance,
                     "within": term is None, "off_term": term, "why": why})
    columns = ["run", "run_id", "framework", "strategy", "num_ranks", "num_microbatches", "compute_ms", "update_ms",
               "comm_ms", "per_bucket_ms", "overhead_ms", "predicted_ms", "measured_ms", "measured_sync_ms", "ratio",
               "comm_mean_ms", "tolerance", "within", "off_term", "why"]
    return pd.DataFrame(rows, columns=columns)

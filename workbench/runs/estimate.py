"""The memory model against measurement: the estimate for a run's spec, and the two side by side.

:func:`estimate_run_memory` turns a :class:`~workbench.launch.driver.RunSpec` into the
:func:`~workbench.estimate.memory.estimate_memory` call that describes it: the LM's parameter shapes,
the strategy, precision and optimizer, the bucket and shard plans of its
``communication_size``, activations, and how the framework's step updates (MLX returns a new
parameter tree and reuses optimizer buffers; a jitted JAX step without donation returns new
parameters and new optimizer state). :func:`memory_validation` compares it, per run and rank,
with what the ranks measured (:mod:`workbench.launch.driver` stores it in every run record):

* ``parameters`` and ``optimizer_state``: bytes of the live arrays on the rank (MLX arrays; the
  JAX device's shards). Target: within :data:`COMPONENT_TOLERANCE`.
* ``peak``: MLX's ``mx.get_peak_memory`` over the run (its allocator's high-water mark of array
  bytes); JAX on CPU has no allocator statistics, so its ``peak`` is XLA's buffer plan of the
  compiled step (arguments + outputs + temporaries). Target: within :data:`PEAK_TOLERANCE`
  for MLX. XLA's plan reuses output buffers for gradients where it can, which a closed formula
  does not follow: the JAX peak is reported, with its ratio, but not held to the target.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from workbench.core.buckets import plan_buckets
from workbench.core.shards import plan_shards
from workbench.core.specs import DTYPE_BYTES, ModelSpec
from workbench.core.strategies import MODEL_STRATEGY
from workbench.estimate.memory import MemoryEstimate, estimate_activation_bytes, estimate_memory
from workbench.models.init import LMConfig, lm_param_shapes

if TYPE_CHECKING:
    import pandas as pd

#: The LM the validation runs use: model states dominate (13.7 MB of fp32 parameters; with 4
#: sequences per rank the activations stay below the step's transients), as in a real FSDP run.
VALIDATION_MODEL = dict(vocab_size=512, seq_len=32, dim=256, num_layers=4, num_heads=4, mlp_dim=1024)
COMPONENT_TOLERANCE = 0.05
PEAK_TOLERANCE = 0.10
#: Run strategy -> the memory model's strategy.
#: What each framework's step writes beside the old arrays (``estimate_memory(update_copies=...)``).
UPDATE_COPIES = {"mlx": "parameters", "jax": "parameters_and_state"}


def run_model_spec(spec: Any) -> ModelSpec:
    """The parameter shapes of a run's LM, in its precision (``spec``: a RunSpec or its dict)."""
    fields = spec if isinstance(spec, Mapping) else spec.to_dict()
    return ModelSpec.from_shapes(dict(lm_param_shapes(LMConfig(**fields["model"]))), name="lm", dtype=fields["precision"])


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


def estimate_run_memory(spec: Any) -> MemoryEstimate:
    """Per-rank memory estimate of a run (a :class:`~workbench.launch.driver.RunSpec` or its dict).

    The bucket plan is MLX's rule at ``communication_size`` (the JAX FSDP step uses the same
    plan); ``fsdp-full`` is ZeRO-3 with one unit per transformer block plus the root. With
    ``num_microbatches`` G > 1, activations are one micro-batch's and the accumulator follows
    ``defer_sync`` (:func:`~workbench.estimate.memory.estimate_memory`). ``fsdp-full`` without deferred sync
    recomputes each block in backward (``estimate_run_activation_bytes(recompute=True)``), and on
    MLX its unit's backward buffers are ``ShardedUnit``'s (``unit_buffers="mlx"``).
    """
    fields = spec if isinstance(spec, Mapping) else spec.to_dict()
    strategy, n, precision = fields["strategy"], fields["num_ranks"], fields["precision"]
    if strategy not in MODEL_STRATEGY:
        raise ValueError(f"strategy {strategy!r} has no memory model; known: {', '.join(MODEL_STRATEGY)}.")
    g = fields.get("num_microbatches", 1)
    model = run_model_spec(fields)
    buckets = plan_buckets(model, fields["communication_size"])
    shard_plan = plan_shards(buckets, n, strategy.split("-")[1]) if strategy in ("fsdp-row", "fsdp-flat") else None
    config = LMConfig(**fields["model"])
    defer = fields.get("defer_sync", True)
    # fsdp-full reshards after forward, so each unit recomputes its block in backward; deferred sync
    # (G > 1) runs the gathered model without the units' rematerialisation.
    recompute = strategy == "fsdp-full" and not (g > 1 and defer)
    return estimate_memory(
        model, MODEL_STRATEGY[strategy], n, param_dtype=precision, master_dtype=None, optimizer=fields["optimizer"],
        optimizer_state_dtype=precision, bucket_plan=buckets if strategy != "fsdp-full" else None,
        shard_plan=shard_plan, update_copies=UPDATE_COPIES[fields["framework"]],
        num_microbatches=g, defer_sync=defer,
        unit_buffers="mlx" if strategy == "fsdp-full" and fields["framework"] == "mlx" else "parameters_and_gradients",
        activation_bytes=estimate_run_activation_bytes(config, fields["global_batch"] // (n * g), precision,
                                                       recompute=recompute))


def predicted_components(estimate: MemoryEstimate) -> dict[str, int]:
    """The estimate in the terms a rank can measure: parameters, optimizer state (with master
    weights and the flat layout's padding, which lives in the sharded state), and the peak."""
    padding = estimate["flat_padding"] if estimate.strategy in ("zero1", "zero2", "fsdp") else 0
    return {"parameters": estimate["parameters"],
            "optimizer_state": estimate["optimizer_state"] + estimate["master_weights"] + padding,
            "peak": estimate.total_bytes}


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


def memory_validation(loaded) -> "pd.DataFrame":
    """Predicted against measured memory, one row per (done run, rank, component).

    Args:
        loaded: :func:`workbench.runs.store.load_runs` output.

    Returns:
        Columns ``run``, ``run_id``, ``framework``, ``strategy``, ``rank``, ``component``
        (``parameters``, ``optimizer_state``, ``peak``), ``predicted_bytes``, ``measured_bytes``,
        ``ratio`` (measured / predicted), ``tolerance`` (None where no target applies: the JAX
        peak), ``within`` (bool or None) and ``source`` (how it was measured). Runs recorded
        before measurements were stored contribute no rows.
    """
    import pandas as pd

    rows = []
    runs = loaded.runs
    done = runs[runs.status == "done"] if "status" in runs else runs.iloc[0:0]
    for _, run in done.iterrows():
        spec = spec_from_row(run)
        predicted = predicted_components(estimate_run_memory(spec))
        for rank in run.get("summary.ranks") or []:
            measured = rank.get("measured_memory")
            if not measured:
                continue
            for component, want in predicted.items():
                got = measured.get(component)
                if got is None:
                    continue
                tolerance = (PEAK_TOLERANCE if spec["framework"] == "mlx" else None) if component == "peak" \
                    else COMPONENT_TOLERANCE
                ratio = got / want if want else float("nan")
                rows.append({
                    "run": f"{spec['framework']} {spec['strategy']}", "run_id": run.run_id,
                    "framework": spec["framework"], "strategy": spec["strategy"], "rank": rank.get("rank"),
                    "component": component, "predicted_bytes": int(want), "measured_bytes": int(got), "ratio": ratio,
                    "tolerance": tolerance, "within": None if tolerance is None else bool(abs(ratio - 1) <= tolerance),
                    "source": measured.get("peak_source", "live arrays") if component == "peak" else "live arrays",
                })
    columns = ["run", "run_id", "framework", "strategy", "rank", "component", "predicted_bytes", "measured_bytes",
               "ratio", "tolerance", "within", "source"]
    return pd.DataFrame(rows, columns=columns)


def memory_validation_summary(table: "pd.DataFrame") -> "pd.DataFrame":
    """Per strategy and component: the worst |ratio - 1| over ranks and runs, and whether all are within target."""
    import pandas as pd

    if table.empty:
        return pd.DataFrame(columns=["framework", "strategy", "component", "worst_error", "tolerance", "within"])
    t = table.assign(error=(table.ratio - 1).abs())
    g = t.groupby(["framework", "strategy", "component"], sort=True)
    out = g.agg(worst_error=("error", "max"), tolerance=("tolerance", "first")).reset_index()
    out["within"] = [None if pd.isna(tol) else bool(err <= tol) for err, tol in zip(out.worst_error, out.tolerance)]
    return out

"""MLX's own ``fully_shard`` beside the steps it replaced, on one model and N (issue 28; notebooks 03, 06, the deck).

Four ways to shard the same run (:data:`SIDE_BY_SIDE`), each with its memory per rank (measured peak and the
memory model's), its step time and its collectives per step (counted by the ranks and the record's count):

* ``mlx-fully-shard``: MLX's ``nn.fully_shard`` (MLX >= 0.32.1): each block, then the root, gathered in forward
  and kept to backward, gradients reduce-scattered in backward (on ring and MPI by the workbench's CPU
  reduce-scatter, supplied as ``sum_scatter``).
* ``fsdp-row``: the workbench's ``fsdp_apply_gradients`` step (the seed's API, MLX PR #3130, removed from MLX by
  PR #3768): parameters and gradients whole, the optimizer state sharded; buckets reduce-scattered, the new
  rows all-gathered.
* ``fsdp-full``: the workbench's ZeRO-3 with the same units, each block freed after forward and gathered again
  for its backward.
* ``fsdp-full`` kept to backward (``reshard_after_forward=False``): a run cannot choose it (a run follows its
  strategy's record, and ``fsdp-full``'s reshards; ``make_zero3_trainer(reshard_after_forward=False)`` can),
  so this row is the memory and communication models' only.

:func:`fully_shard_comparison` draws the rows from a run store; :func:`comparison_display` words them for a
slide; :func:`runnable_accumulation_specs` is the accumulation sweep without the modes a record cannot run
(``fully_shard`` cannot defer its sync; JAX does not run it).
"""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from workbench.estimate.breakdown import MemoryEstimate
from workbench.estimate.memory import estimate_memory
from workbench.models.init import LMConfig
from workbench.runs.estimate import (
    estimate_run_activation_bytes,
    estimate_run_memory,
    run_model_spec,
    spec_from_row,
)
from workbench.strategies import COLLECTIVE_KINDS, StepShape, get_strategy
from workbench.studies.accumulation import accumulation_specs, step_shape
from workbench.studies.step_time import steady_median

if TYPE_CHECKING:
    import pandas as pd

#: The rows, in order: (label, strategy, reshard_after_forward; None: the record's own).
SIDE_BY_SIDE = (
    ("MLX fully_shard", "mlx-fully-shard", None),
    ("fsdp_apply_gradients (workbench, row)", "fsdp-row", None),
    ("ZeRO-3 (workbench), reshard after forward", "fsdp-full", True),
    ("ZeRO-3 (workbench), kept to backward", "fsdp-full", False),
)


def _run_fields(spec: Any) -> dict:
    """Every field of a run's spec (a RunSpec or its dict), validated, defaults filled."""
    from workbench.runs.spec import RunSpec

    return asdict(spec if isinstance(spec, RunSpec) else RunSpec(**spec))


def _resharding(fields: Mapping[str, Any], reshard_after_forward: bool | None) -> bool:
    """``reshard_after_forward`` for ``fields``' strategy: its record's (None), or one a ZeRO-3 record may take.

    Raises:
        ValueError: asking another value of a record that gathers no units or is MLX's own ``fully_shard``
            (whose VJP fixes it), naming the strategy.
    """
    record = get_strategy(fields["strategy"])
    if reshard_after_forward is None or reshard_after_forward == record.reshard_after_forward:
        return record.reshard_after_forward
    if not record.gathers_units or record.family != "zero_3":
        raise ValueError(f"strategy {record.name!r} ({record.family}) has no reshard_after_forward to choose: "
                         "only ZeRO-3 strategies gather units that a step may keep to backward or free after forward.")
    return reshard_after_forward


def estimate_comparison_memory(spec: Any, reshard_after_forward: bool | None = None) -> MemoryEstimate:
    """Per-rank memory estimate of a run (:func:`~workbench.runs.estimate.estimate_run_memory`), with a ZeRO-3
    strategy's ``reshard_after_forward`` as given (None: its record's; the estimate is then the run's own).

    Kept to backward, no block is recomputed (the activations of the whole model are kept) and every unit's
    parameters stay gathered until its backward (the ``gathered_unit`` row of
    :func:`~workbench.estimate.memory.estimate_memory` with ``reshard_after_forward=False``).

    Raises:
        ValueError: as :func:`_resharding`, or a bad spec field (named).
    """
    fields = _run_fields(spec)
    reshard = _resharding(fields, reshard_after_forward)
    if reshard == get_strategy(fields["strategy"]).reshard_after_forward:
        return estimate_run_memory(fields)
    n, g, defer, precision = fields["num_ranks"], fields["num_microbatches"], fields["defer_sync"], fields["precision"]
    impl = get_strategy(fields["strategy"]).implementation(fields["framework"])
    recompute = reshard and not (g > 1 and defer)  # as the run estimate: a resharded unit re-runs its block
    activations = estimate_run_activation_bytes(LMConfig(**fields["model"]), fields["global_batch"] // (n * g),
                                                precision, recompute=recompute)
    return estimate_memory(
        run_model_spec(fields), fields["strategy"], n, param_dtype=precision, master_dtype=None,
        optimizer=fields["optimizer"], optimizer_state_dtype=precision,
        update_copies=impl.update_copies, num_microbatches=g, defer_sync=defer,
        reshard_after_forward=reshard, unit_buffers=impl.unit_buffers, activation_bytes=activations)


def comparison_step_shape(spec: Any, reshard_after_forward: bool | None = None) -> StepShape:
    """:func:`~workbench.studies.accumulation.step_shape` of a run, a ZeRO-3 strategy's units kept to backward
    where ``reshard_after_forward`` is False (none gathered again), else as its record runs them."""
    fields = _run_fields(spec)
    shape = step_shape(fields)
    if _resharding(fields, reshard_after_forward) or shape.units is None:
        return shape
    return replace(shape, units=tuple((b, False) for b, _ in shape.units))


def _counted(run: Any) -> int | None:
    """Collectives per step the ranks of ``run`` (a ``load_runs`` row) counted, all kinds; None if unrecorded.

    Raises:
        ValueError: if its ranks report different counts, naming the run.
    """
    counts = [{k: int(r.get("collectives", {}).get(k, 0)) for k in COLLECTIVE_KINDS} for r in run["summary.ranks"]]
    if not counts or not any("collectives" in r for r in run["summary.ranks"]):
        return None
    if any(c != counts[0] for c in counts):
        raise ValueError(f"run {run.run_id}: ranks report different collectives: {counts}")
    return sum(counts[0].values())


def _select(loaded, num_microbatches: int) -> dict[str, Any]:
    """The done MLX runs of :data:`SIDE_BY_SIDE`'s strategies at ``num_microbatches`` (syncing every
    micro-batch where G > 1: the one mode every one of them runs), by strategy; one spec apart from the strategy.

    Raises:
        ValueError: without any such run, with two of one strategy, or with runs whose other fields differ
            (naming the field and both values).
    """
    wanted, chosen = {s for _, s, _ in SIDE_BY_SIDE}, {}
    runs = loaded.runs
    for _, run in (runs[runs.status == "done"] if "status" in runs else runs.iloc[0:0]).iterrows():
        fields = _run_fields(spec_from_row(run))
        if (fields["framework"] != "mlx" or fields["strategy"] not in wanted
                or fields["num_microbatches"] != num_microbatches or (num_microbatches > 1 and fields["defer_sync"])):
            continue
        if fields["strategy"] in chosen:
            raise ValueError(f"two done runs of {fields['strategy']!r} at G = {num_microbatches}: "
                             f"{chosen[fields['strategy']][0].run_id} and {run.run_id}; compare one store of one spec.")
        chosen[fields["strategy"]] = (run, fields)
    if not chosen:
        raise ValueError(f"no done MLX run of {', '.join(sorted(wanted))} at num_microbatches={num_microbatches} "
                         "in the store: nothing to set the four side by side on.")
    base = next(iter(chosen.values()))
    for run, fields in chosen.values():
        for key, value in fields.items():
            if key != "strategy" and value != base[1][key]:
                raise ValueError(f"runs {base[0].run_id} and {run.run_id} differ in {key} ({base[1][key]!r} vs "
                                 f"{value!r}): the strategies are compared on one model and N.")
    return chosen


def fully_shard_comparison(loaded, *, num_microbatches: int = 1) -> "pd.DataFrame":
    """MLX's ``fully_shard``, the workbench's FSDP step and its ZeRO-3 with and without resharding, side by side.

    Args:
        loaded: :func:`workbench.runs.tables.load_runs` of a store holding MLX runs of the same spec under
            ``mlx-fully-shard``, ``fsdp-row`` and ``fsdp-full`` (a strategy without a run gets the models'
            figures only).
        num_microbatches: G of the runs to compare; with G > 1 the runs that sync every micro-batch
            (``fully_shard`` cannot defer).

    Returns:
        One row per :data:`SIDE_BY_SIDE` entry, in its order. Columns: ``label``, ``strategy``,
        ``reshard_after_forward``, ``measured`` (False: the models' figures only), ``peak_mib`` (largest
        ``mx.get_peak_memory`` over ranks, MiB), ``model_peak_mib`` (the memory model, MiB), ``peak_ratio``,
        ``step_ms`` (median step after warm-up, slowest rank), ``collectives`` (per step, counted by the
        ranks), ``expected_collectives`` (the record's count), ``all_gather``, ``reduce_scatter``,
        ``all_reduce`` (the record's, by kind), ``mib_sent`` (per rank per step on a ring, model), ``run_id``.

    Raises:
        ValueError: as :func:`_select`: no run, two runs of a strategy, or runs of different specs.
    """
    import pandas as pd

    chosen = _select(loaded, num_microbatches)
    base = next(iter(chosen.values()))[1]
    rows = []
    for label, strategy, reshard in SIDE_BY_SIDE:
        fields = {**base, "strategy": strategy}
        record = get_strategy(strategy)
        shape = comparison_step_shape(fields, reshard)
        counts = record.collective_counts(shape)
        run = chosen[strategy][0] if strategy in chosen and reshard in (None, record.reshard_after_forward) else None
        model_peak = estimate_comparison_memory(fields, reshard).total_bytes
        peaks = [r.get("measured_memory", {}).get("peak") for r in run["summary.ranks"]] if run is not None else []
        peak = max((p for p in peaks if p is not None), default=None)
        step_s = steady_median(loaded.steps[loaded.steps.run_id == run.run_id], "step_time_s") if run is not None \
            else None
        rows.append({
            "label": label, "strategy": strategy, "reshard_after_forward": _resharding(fields, reshard),
            "measured": run is not None, "peak_mib": None if peak is None else peak / 2**20,
            "model_peak_mib": model_peak / 2**20, "peak_ratio": None if peak is None else peak / model_peak,
            "step_ms": None if step_s is None else step_s * 1e3,
            "collectives": None if run is None else _counted(run), "expected_collectives": sum(counts.values()),
            **{k: counts[k] for k in ("all_gather", "reduce_scatter", "all_reduce")},
            "mib_sent": record.bytes_sent(shape) / 2**20, "run_id": None if run is None else run.run_id,
        })
    return pd.DataFrame(rows)


#: Reader-facing headers of :func:`comparison_display`.
DISPLAY_HEADERS = {"peak_mib": "peak MiB per rank, measured", "model_peak_mib": "peak MiB per rank, model",
                   "peak_ratio": "measured / model", "step_ms": "step (ms)",
                   "collectives": "collectives per step, counted", "expected_collectives": "collectives per step, model",
                   "mib_sent": "MiB sent per rank per step (model)"}


#: How :func:`comparison_display` writes each column (MiB to 0.1, ratios to 0.001, ms and counts whole).
DISPLAY_FORMATS = {"peak_mib": "{:.1f}", "model_peak_mib": "{:.1f}", "peak_ratio": "{:.3f}", "step_ms": "{:.0f}",
                   "collectives": "{:.0f}", "expected_collectives": "{:.0f}", "mib_sent": "{:.1f}"}
#: What :func:`comparison_display` writes where a row has no run (the models' figures only).
NOT_RUN = "-"


def comparison_display(table: "pd.DataFrame") -> "pd.DataFrame":
    """:func:`fully_shard_comparison` as a slide shows it: one row per label, headers in words with units
    (:data:`DISPLAY_HEADERS`), numbers written as :data:`DISPLAY_FORMATS` says, and :data:`NOT_RUN` where
    there is no measurement."""
    import pandas as pd

    shown = table.set_index("label")[list(DISPLAY_HEADERS)]
    shown = pd.DataFrame({col: [NOT_RUN if pd.isna(v) else DISPLAY_FORMATS[col].format(v) for v in shown[col]]
                          for col in shown}, index=shown.index)
    return shown.rename(columns=DISPLAY_HEADERS).rename_axis(None)


def runnable_accumulation_specs(base: Mapping[str, Any], *, frameworks: Sequence[str], strategies: Sequence[str],
                                microbatches: Iterable[int]) -> list:
    """:func:`~workbench.studies.accumulation.accumulation_specs` of the pairs a record runs: a framework without
    the strategy's implementation is left out, and a strategy that cannot defer its sync (``fully_shard``) runs
    each G > 1 syncing every micro-batch only."""
    from workbench.runs.spec import RunSpec

    microbatches, out = list(microbatches), []
    for framework in frameworks:
        for strategy in strategies:
            record = get_strategy(strategy)
            if framework not in record.frameworks:
                continue
            if record.implementation(framework).defers_sync:
                out += accumulation_specs(base, frameworks=[framework], strategies=[strategy], microbatches=microbatches)
            else:
                out += [RunSpec(**{**base, "framework": framework, "strategy": strategy, "num_microbatches": g,
                                   "defer_sync": g == 1}) for g in microbatches]
    return out

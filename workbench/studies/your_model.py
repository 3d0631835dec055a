"""Notebook 07, your model: everything it shows is about the model in its parameter cell, and nothing else.

:func:`your_model` turns the parameter cell (a factory, or a ``config.json``/preset) into a
:class:`YourModel`: its shapes in the precision asked, its architecture when a config carries one, the
bucket size it gets, and the runs of exactly this model (:class:`~workbench.runs.spec.RunSpec`\\ s, whose ids
hash the factory's source, the data and every knob). What cannot be trained here (a config brings shapes but no
code; a model too large for this machine) is one line in :attr:`YourModel.notes`, and the plans and the memory
prediction are still made. :func:`load_model_runs` reads from a store only those runs, so a store that
also holds another model's runs (the example's, from before ``MODEL`` changed) never shows them.

:func:`profile_table` shows each framework's measured profile (:func:`workbench.launch.profile.profile_model`)
and what it cost; :func:`peak_table` holds each run's measured peak against the prediction made from that
profile (:func:`workbench.runs.profile.estimate_with_profile`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from workbench.core.resolve import resolve_architecture, resolve_spec
from workbench.core.specs import DTYPE_BYTES
from workbench.core.units import KiB, MiB, format_bytes
from workbench.estimate.activations import estimate_activation_bytes
from workbench.estimate.memory import estimate_memory
from workbench.runs.estimate import spec_from_row
from workbench.runs.profile import estimate_with_profile
from workbench.runs.spec import RunSpec
from workbench.runs.store import run_id_for
from workbench.runs.tables import LoadResult
from workbench.studies.memory import PEAK_TOLERANCE, predicted_components

if TYPE_CHECKING:
    import pandas as pd

    from workbench.core.architecture import ArchitectureConfig
    from workbench.core.specs import ModelSpec
    from workbench.runs.profile import ModelProfile

#: MLX's default bucket size (``mlx.nn.average_gradients``' ``communication_size``).
MLX_COMMUNICATION_SIZE = 32 * MiB
#: A model smaller than this many default buckets gets a smaller power of two, so its plan has several.
MIN_BUCKETS = 4
#: Share of this machine's memory the notebook's runs may be predicted to take, all ranks together.
MEMORY_SHARE = 0.5
#: Why a JAX run's peak is shown, not held: what the rank stores as its peak on CPU.
JAX_PEAK_CAUSE = "stored peak is XLA's buffer plan, not a measurement"


def format_count(n: int) -> str:
    """A parameter count for people: ``format_count(44_400_000) == '44.4M'``, ``'20.6K'``, ``'8.03B'``, ``'512'``."""
    for scale, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{suffix}"
    return f"{n:,}"


def default_communication_size(nbytes: int) -> int:
    """MLX's 32 MiB, or for a model under :data:`MIN_BUCKETS` of them the largest power of two (>= 4 KiB) at
    most ``nbytes / MIN_BUCKETS``, so a small model still shows several buckets and a large one is not cut into
    hundreds (a 44M-parameter fp32 model gets 32 MiB, where a fixed 16 KiB cut it into 30 buckets; the 80 KiB
    example gets 16 KiB)."""
    size = 4 * KiB
    while size * 2 <= min(nbytes / MIN_BUCKETS, MLX_COMMUNICATION_SIZE):
        size *= 2
    return size


@dataclass(frozen=True)
class YourModel:
    """The model of notebook 07's parameter cell.

    Attributes:
        name: The factory (``"package.module:function"``) or the config's name.
        kind: ``"factory"`` or ``"config"``.
        spec: Its parameters, in ``precision``.
        precision: The dtype its parameters, and its runs, have.
        architecture: Hidden size, heads, layers... when a config carries them (activations are then estimated);
            None for a factory (its activations come from its profile).
        communication_size: Bytes per bucket (:func:`default_communication_size`, unless the cell sets it).
        num_ranks: N of the shard plans and the runs.
        run_specs: The runs of exactly this model (none when it cannot be trained here).
        notes: One line per thing that cannot be done here, and why.
    """

    name: str
    kind: str
    spec: "ModelSpec"
    precision: str
    architecture: "ArchitectureConfig | None"
    communication_size: int
    num_ranks: int
    run_specs: tuple[RunSpec, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def title(self) -> str:
        """``"tiny_mlp_lm: 20.6K parameters, 80.38 KiB in float32"``."""
        return (f"{self.name}: {format_count(self.spec.num_params)} parameters, {format_bytes(self.spec.nbytes)} "
                f"in {self.precision}")

    def memory_title(self) -> str:
        """The memory figure's title: the model's name and size, as people write it."""
        activations = "activations from the config's architecture" if self.architecture is not None else (
            "activations from its measured profile" if self.kind == "factory" else "no activations")
        return (f"{self.name}, {format_count(self.spec.num_params)} parameters, {self.precision}: memory per rank"
                f"<br><sup>solid: model states; hatched: the transient phase that sets the peak; {activations}</sup>")


def machine_memory_bytes() -> int:
    """This machine's physical memory, bytes (0 if it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def your_model(*, model: str | None, jax_model: str | None = None, config: Any = None, data: str | None = None,
               vocab_size: int, seq_len: int, num_ranks: int = 2, precision: str | None = None,
               strategies: Sequence[str] = ("ddp", "fsdp-row", "fsdp-flat", "fsdp-full"),
               communication_size: int | None = None, memory_bytes: int | None = None,
               **run_fields: Any) -> YourModel:
    """The model of the parameter cell, its plans' inputs, and the runs of exactly this model.

    Args:
        model, jax_model: The MLX factory and its JAX twin (``"package.module:function"``; ``jax_model`` may be None).
        config: A ``config.json`` path or dict, or a preset name: then the model is this config (``model`` is
            not used), planned from its shapes, not trained.
        data, vocab_size, seq_len: The token file and what the model takes (RunSpec's ``data`` and ``model``).
        num_ranks: N of the shard plans and of the runs.
        precision: ``"float32"`` or ``"bfloat16"``; None: the config's ``torch_dtype`` (float32 for a factory).
        strategies: The strategies to run.
        communication_size: Bytes per bucket; None: :func:`default_communication_size` of the model.
        memory_bytes: The memory the runs may take, all ranks; None: :data:`MEMORY_SHARE` of this machine's.
        **run_fields: Further RunSpec fields of every run (``steps``, ``global_batch``, ``learning_rate``...).

    Raises:
        ValueError: a bad factory, data file, config or knob, naming it (RunSpec's and resolve_spec's errors).
    """
    if config is not None:
        spec = resolve_spec(config, dtype=precision, argument="CONFIG")
        precision = precision or spec.params[0].dtype
        try:
            architecture = resolve_architecture(config, argument="CONFIG")
        except ValueError:
            architecture = None
        name = getattr(architecture, "name", None) or spec.name
        size = communication_size or default_communication_size(spec.nbytes)
        note = (f"{name} is planned, not trained: a config brings shapes, not code (set MODEL to a factory that "
                "builds it, and CONFIG = None, to train it)")
        return YourModel(name, "config", spec, precision, architecture, size, num_ranks, (), (note,))
    if model is None:
        raise ValueError("MODEL: give a factory 'package.module:function', or set CONFIG to a config.json")
    from workbench.ranks.user_model import user_model_spec

    precision = precision or "float32"
    common = dict(num_ranks=num_ranks, model=dict(vocab_size=vocab_size, seq_len=seq_len), data=data,
                  precision=precision, **run_fields)
    first = RunSpec(framework="mlx", model_factory=model, **common)  # a bad factory or data file fails here, named
    spec = user_model_spec(first)
    size = communication_size or default_communication_size(spec.nbytes)
    common["communication_size"] = size
    notes, runs = [], []
    for framework, factory in (("mlx", model), ("jax", jax_model)):
        if factory is None:
            continue
        for strategy in strategies:
            try:
                runs.append(RunSpec(framework=framework, strategy=strategy, model_factory=factory, **common))
            except ValueError as err:  # a strategy or precision this framework cannot run: said, not hidden
                notes.append(f"{framework} {strategy} is not run: {err}")
    limit = memory_bytes if memory_bytes is not None else int(machine_memory_bytes() * MEMORY_SHARE)
    need = num_ranks * estimate_memory(spec, "ddp", num_ranks, param_dtype=precision, master_dtype=None).total_bytes
    if limit and need > limit:
        notes.append(f"{model} is not trained here: {num_ranks} ranks would hold {format_bytes(need)} before "
                     f"activations, over the {format_bytes(limit)} this machine lends them; plans and memory only")
        runs = []
    return YourModel(model, "factory", spec, precision, None, size, num_ranks, tuple(runs), tuple(notes))


def load_model_runs(loaded: LoadResult, run_specs: Sequence[RunSpec]) -> LoadResult:
    """Only the runs of ``run_specs`` out of a store's ``loaded`` runs (:func:`~workbench.runs.tables.load_runs`):
    a run of another model, or of this model with other data or knobs, has another id and is left out."""
    wanted = {run_id_for(s.to_dict()) for s in run_specs}
    runs = loaded.runs[loaded.runs.run_id.isin(wanted)].reset_index(drop=True)
    steps = loaded.steps[loaded.steps.run_id.isin(wanted)].reset_index(drop=True)
    return LoadResult(runs=runs, steps=steps, problems=list(loaded.problems))


def micro_batch_size(model: YourModel, global_batch: int) -> int:
    """Sequences per rank of a run of ``global_batch`` on ``model.num_ranks`` ranks."""
    return max(1, global_batch // model.num_ranks)


def memory_estimates(model: YourModel, strategies: Sequence[str], num_shards: Sequence[int], *, seq_len: int,
                     micro_batch: int, profile: "ModelProfile | None" = None) -> list:
    """Per-rank memory of ``model`` for each strategy and N (``num_shards`` and the runs' N; strategy-major), in its precision (optimizer state
    too, no master copy, as its runs hold it), with activations: from the config's architecture (Korthikanti et
    al., 16-bit activations scaled to the precision, no recomputation), else from ``profile`` at ``micro_batch`` sequences, else none (said in the title)."""
    if model.architecture is not None:
        activations = estimate_activation_bytes(seq_len=seq_len, micro_batch_size=micro_batch,
                                                config=model.architecture) * DTYPE_BYTES[model.precision] // 2
    else:
        activations = profile.activation_bytes_at(micro_batch) if profile is not None else 0
    shards = sorted({model.num_ranks, *num_shards})  # the runs' N is always among them
    return [estimate_memory(model.spec, s, n, param_dtype=model.precision, master_dtype=None,
                            activation_bytes=activations) for s in strategies for n in shards]


def profile_table(profiles: Mapping[str, "ModelProfile"], micro_batch: int) -> "pd.DataFrame":
    """Each framework's profile, one column per framework: the sizes measured, activations per sequence and at
    the runs' ``micro_batch``, forward and backward at it, the optimizer update, how the peak was read, and what
    profiling cost (wall seconds; the profiling process's peak resident memory)."""
    import pandas as pd

    rows = {fw: {"sequences measured": ", ".join(map(str, p.micro_batch_sizes)),
                 "activations per sequence": format_bytes(p.activation_fit.slope),
                 f"activations at {micro_batch} sequences": format_bytes(p.activation_bytes_at(micro_batch)),
                 f"forward and backward at {micro_batch} sequences": f"{p.compute_s_at(micro_batch) * 1e3:.1f} ms",
                 "optimizer update": f"{p.update_s * 1e3:.2f} ms", "peak read as": p.truth_source.split(",")[0],
                 "profile cost": f"{p.cost_s:.1f} s", "profile memory": format_bytes(p.cost_peak_rss_bytes)}
            for fw, p in profiles.items()}
    return pd.DataFrame(rows)


def peak_table(loaded: LoadResult, profiles: Mapping[str, "ModelProfile"]) -> "pd.DataFrame":
    """Each done run's largest measured peak over its ranks against the peak predicted from its framework's
    profile: ``run``, ``framework``, ``predicted_bytes``, ``measured_bytes``, ``ratio``, ``within``
    (:data:`~workbench.studies.memory.PEAK_TOLERANCE`; None where the stored peak is not a measurement) and
    ``cause`` (why a run is not held)."""
    import pandas as pd

    rows = []
    runs = loaded.runs
    for _, run in runs[runs.status == "done"].iterrows() if "status" in runs else ():
        spec = spec_from_row(run)
        measured = [r.get("measured_memory") or {} for r in run.get("summary.ranks") or []]
        peaks = [(m["peak"], m.get("peak_source", "")) for m in measured if m.get("peak") is not None]
        profile = profiles.get(spec["framework"])
        if not peaks or profile is None:
            continue
        predicted = predicted_components(estimate_with_profile(spec, profile, run.get("model_shapes")))["peak"]
        peak, source = max(peaks)
        ratio = peak / predicted
        plan = source.startswith("XLA")
        rows.append({"run": f"{spec['framework']} {spec['strategy']}", "framework": spec["framework"],
                     "predicted_bytes": int(predicted), "measured_bytes": int(peak), "ratio": ratio,
                     "within": None if plan else bool(abs(ratio - 1) <= PEAK_TOLERANCE),
                     "cause": JAX_PEAK_CAUSE if plan else ""})
    return pd.DataFrame(rows, columns=["run", "framework", "predicted_bytes", "measured_bytes", "ratio", "within",
                                       "cause"])


def peak_display(table: "pd.DataFrame") -> "pd.DataFrame":
    """:func:`peak_table` as a reader reads it: bytes with units, the ratio to 2 decimals, the verdict in words."""
    verdict = {True: "within 10%", False: "outside 10%"}
    return table.assign(predicted=table.predicted_bytes.map(format_bytes),
                        measured=table.measured_bytes.map(format_bytes), ratio=table.ratio.map("{:.2f}".format),
                        held=[verdict.get(w, "shown, not held") for w in table.within]
                        )[["run", "predicted", "measured", "ratio", "held", "cause"]].set_index("run")


def parameters_table(model: YourModel) -> "pd.DataFrame":
    """One row per array, in the order gradients are bucketed: its shape and bytes."""
    import pandas as pd

    return pd.DataFrame([{"array": p.path, "shape": " x ".join(map(str, p.shape)), "bytes": format_bytes(p.nbytes)}
                         for p in model.spec.params]).set_index("array")


def profile_your_model(model: YourModel, runs_root: Any, **kwargs: Any) -> dict[str, "ModelProfile"]:
    """Each framework's profile of ``model`` (:func:`~workbench.launch.profile.profile_model` of its first run:
    measured once on one process, then read from ``<runs_root>/.profiles``); ``{}`` for a model without runs."""
    from workbench.launch.profile import profile_model

    firsts = {}
    for spec in model.run_specs:
        firsts.setdefault(spec.framework, spec)
    return {fw: profile_model(spec, runs_root, **kwargs) for fw, spec in firsts.items()}


def build_explorer(model: YourModel, config: Any, *, seq_len: int, micro_batch: int):
    """The memory explorer (:func:`~workbench.views.memory_explorer.build_memory_explorer`) on this model: its
    config (activations from the architecture) or, for a factory, its shapes; in its precision, N from 1 to 1024."""
    from workbench.views.memory_explorer import build_memory_explorer

    return build_memory_explorer(config if config is not None else model.spec, num_shards=(1, 1024),
                                 param_dtype=model.precision, master_dtype=None, micro_batch_size=micro_batch,
                                 seq_len=seq_len)


def runs_or_note(model: YourModel, make: Any) -> Any:
    """``make()`` (a figure or table of the runs) if ``model`` is trained here, else its notes as one Markdown
    block: nothing of another model stands in for the runs it does not have."""
    if model.run_specs:
        return make()
    from IPython.display import Markdown

    return Markdown("\n".join(f"> {note}" for note in model.notes) or "> no runs")


def states_display(validation: "pd.DataFrame") -> "pd.DataFrame":
    """Per run, measured / predicted of parameters and optimizer state (the worst rank), to 3 decimals, from
    :func:`~workbench.studies.memory.memory_validation`."""
    states = validation[validation.component != "peak"]
    worst = states.assign(error=(states.ratio - 1).abs()).sort_values("error").groupby(["run", "component"]).last()
    table = worst.ratio.unstack("component").map("{:.3f}".format)
    return table.rename(columns={"parameters": "parameters, measured / predicted",
                                 "optimizer_state": "optimizer state, measured / predicted"})

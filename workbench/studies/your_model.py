"""Notebook 07, your model: everything it shows is about the model in its parameter cell, and nothing else.

:func:`your_model` turns the parameter cell (a factory, or a ``config.json``/preset) into a
:class:`YourModel`: its shapes in the precision asked, its architecture when a config carries one, the
bucket size it gets, and the runs of exactly this model (:class:`~workbench.runs.spec.RunSpec`\\ s, whose ids
hash the factory's source, the data and every knob). What cannot be trained here (a config brings shapes but no
code; a model too large for this machine) is one line in :attr:`YourModel.notes`, and the plans and the memory
prediction are still made. :func:`load_model_runs` reads from a store only those runs, so a store that
also holds another model's runs (the example's, from before ``MODEL`` changed) never shows them.

Its measured profile and each run's peak against the prediction from it: :mod:`workbench.studies.your_model_memory`.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from workbench.core.paths import RUNS_DIR
from workbench.core.resolve import resolve_architecture, resolve_spec
from workbench.core.specs import DTYPE_BYTES
from workbench.core.units import KiB, MiB, format_bytes, format_params
from workbench.estimate.activations import estimate_activation_bytes
from workbench.estimate.memory import estimate_memory
from workbench.runs.atomic import write_atomic
from workbench.runs.spec import RunSpec
from workbench.runs.store import run_id_for
from workbench.runs.tables import LoadResult

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
        return f"{self.name}: {format_params(self.spec.num_params)}, {format_bytes(self.spec.nbytes)} in {self.precision}"

    @property
    def memory_unit(self) -> str:
        """The memory figure's unit: ``"GiB"`` from 1 GiB of parameters, else ``"MiB"`` (binary, as the tables)."""
        return "GiB" if self.spec.nbytes >= 2**30 else "MiB"

    def memory_title(self, profiled: bool = False) -> str:
        """The memory figure's title: the model's name and size, as people write it, and where its activations
        come from (``profiled``: its measured profile, as :func:`memory_estimates` takes them first)."""
        activations = "activations from its measured profile" if profiled else (
            "activations from the config's architecture" if self.architecture is not None else "no activations")
        return (f"{self.name}, {format_params(self.spec.num_params)}, {self.precision}: memory per rank"
                f"<br><sup>solid: model states; hatched: the transient phase that sets the peak; {activations}</sup>")


def machine_memory_bytes() -> int:
    """This machine's physical memory, bytes (0 if it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def config_factory(config: Any, folder: Path = RUNS_DIR) -> str:
    """A RunSpec ``model_factory`` that builds ``config`` with mlx-lm's own class (no weights), so a config trains.

    The config (a preset's, or a ``config.json``'s with the fields it leaves out at transformers' defaults for
    its ``model_type``) is written as JSON data into a module ``<folder>/your_configs/config_<sha12>.py`` whose
    ``factory`` calls :func:`~workbench.models.mlx_lm_config.mlx_lm_factory`; its source, and so the run ids,
    change with the config. ``folder``'s parent must be where engines import from (the repository root).

    Raises:
        ImportError: mlx-lm is not installed. ValueError: mlx-lm cannot build the config (named).
    """
    from workbench.core.hf_config import load_hf_config
    from workbench.core.presets import PRESETS
    from workbench.models.mlx_lm_config import build_mlx_lm

    raw = PRESETS[config].to_hf_config() if isinstance(config, str) and config in PRESETS \
        else load_hf_config(config)[0]
    try:
        from transformers import AutoConfig

        raw = {**AutoConfig.for_model(raw["model_type"]).to_dict(), **raw}
    except Exception:  # an unknown model_type or no transformers: the config as given (mlx-lm names what lacks)
        pass
    build_mlx_lm(raw)  # refuses here, naming the field, rather than on every engine
    text = json.dumps(raw, sort_keys=True, default=str)
    module = f"config_{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    (folder / "your_configs").mkdir(parents=True, exist_ok=True)
    write_atomic(folder / "your_configs" / f"{module}.py", CONFIG_MODULE + f"CONFIG = json.loads({text!r})\n")
    return f"{folder.name}.your_configs.{module}:factory"


CONFIG_MODULE = ('"""Written by workbench.studies.your_model.config_factory: notebook 07\'s CONFIG, built by mlx-lm."""\n'
                 "import json\n\nfrom workbench.models.mlx_lm_config import mlx_lm_factory\n\n\n"
                 "def factory(seed: int = 0):\n    return mlx_lm_factory(CONFIG, seed=seed)\n\n\n")


def your_model(*, model: str | None, jax_model: str | None = None, config: Any = None, data: str | None = None,
               vocab_size: int, seq_len: int, num_ranks: int = 2, precision: str | None = None,
               strategies: Sequence[str] = ("ddp", "fsdp-row", "fsdp-flat", "fsdp-full"),
               communication_size: int | None = None, memory_bytes: int | None = None,
               config_folder: Path = RUNS_DIR, **run_fields: Any) -> YourModel:
    """The model of the parameter cell, its plans' inputs, and the runs of exactly this model.

    Args:
        model, jax_model: The MLX factory and its JAX twin (``"package.module:function"``; ``jax_model`` may be None).
        config: A ``config.json`` path or dict, or a preset name: then the model is this config (``model`` is
            not used), planned from its shapes and trained in MLX through :func:`config_factory` (written under
            ``config_folder``) where mlx-lm builds it.
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
    notes, spec, architecture = [], None, None
    if config is not None:
        spec = resolve_spec(config, dtype=precision, argument="CONFIG")
        precision = precision or spec.params[0].dtype
        try:
            architecture = resolve_architecture(config, argument="CONFIG")
        except ValueError:
            pass
        name = getattr(architecture, "name", None) or spec.name
        too_large = _too_large(name, spec, num_ranks, precision, memory_bytes)
        try:
            factories = {} if too_large else {"mlx": config_factory(config, config_folder)}
            notes.append(too_large or f"{name} trains in MLX as mlx-lm builds it; JAX has no twin of that model here")
        except (ImportError, ValueError) as err:
            factories = {}
            notes.append(f"{name} is planned, not trained: {err}".replace("\n", " "))
    elif model is None:
        raise ValueError("MODEL: give a factory 'package.module:function', or set CONFIG to a config.json")
    else:
        name, factories = model, {"mlx": model, "jax": jax_model}
    precision = precision or "float32"
    common = dict(num_ranks=num_ranks, model=dict(vocab_size=vocab_size, seq_len=seq_len), data=data,
                  precision=precision, **run_fields)
    runs = []
    if factories:
        from workbench.ranks.user_model import user_model_spec

        first = RunSpec(framework="mlx", model_factory=factories["mlx"], **common)  # a bad factory or data: named
        spec = spec or user_model_spec(first)
    size = communication_size or default_communication_size(spec.nbytes)
    for framework, factory in factories.items():
        for strategy in strategies if factory is not None else ():
            try:
                runs.append(RunSpec(framework=framework, strategy=strategy, model_factory=factory,
                                    communication_size=size, **common))
            except ValueError as err:  # a strategy or precision this framework cannot run: said, not hidden
                notes.append(f"{framework} {strategy} is not run: {err}")
    too_large = _too_large(name, spec, num_ranks, precision, memory_bytes) if runs else None
    if too_large:
        notes, runs = [too_large], []
    return YourModel(name, "config" if config is not None else "factory", spec, precision, architecture, size,
                     num_ranks, tuple(runs), tuple(notes))


def _too_large(name: str, spec: "ModelSpec", num_ranks: int, precision: str, memory_bytes: int | None) -> str | None:
    """The line saying ``num_ranks`` DDP ranks of ``spec`` would hold more than the runs may take, or None."""
    limit = memory_bytes if memory_bytes is not None else int(machine_memory_bytes() * MEMORY_SHARE)
    need = num_ranks * estimate_memory(spec, "ddp", num_ranks, param_dtype=precision, master_dtype=None).total_bytes
    if limit and need > limit:
        return (f"{name} is not trained here: {num_ranks} ranks would hold {format_bytes(need)} before activations, "
                f"over the {format_bytes(limit)} this machine lends them; plans and memory only")
    return None


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
    """Per-rank memory of ``model`` for each strategy and N (``num_shards`` and the runs' N; strategy-major), in
    its precision (optimizer state too, no master copy, as its runs hold them), with activations: ``profile``'s at
    ``micro_batch`` sequences (measured), else the config's architecture's (Korthikanti et al., 16-bit activations
    scaled to the precision, no recomputation), else none (:meth:`YourModel.memory_title` says which)."""
    shards = sorted({model.num_ranks, *num_shards})  # the runs' N is always among them
    if profile is not None:  # per N: a JAX profile's line for a run of two or more is scaled to XLA's mesh plan
        activations = {n: profile.activation_bytes_at(micro_batch, n) for n in shards}
    elif model.architecture is not None:
        activations = dict.fromkeys(shards, estimate_activation_bytes(
            seq_len=seq_len, micro_batch_size=micro_batch, config=model.architecture) * DTYPE_BYTES[model.precision] // 2)
    else:
        activations = dict.fromkeys(shards, 0)
    return [estimate_memory(model.spec, s, n, param_dtype=model.precision, master_dtype=None,
                            activation_bytes=activations[n]) for s in strategies for n in shards]


def parameters_table(model: YourModel) -> "pd.DataFrame":
    """One row per array, in the order gradients are bucketed: its shape and bytes."""
    import pandas as pd

    return pd.DataFrame([{"array": p.path, "shape": " x ".join(map(str, p.shape)), "bytes": format_bytes(p.nbytes)}
                         for p in model.spec.params]).set_index("array")


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

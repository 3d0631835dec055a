"""Training runs on real engines: a validated run spec, the per-rank job, and the driver.

* :class:`RunSpec` -- everything that defines a run; validated before any engine starts,
  with errors naming the field.
* :func:`train_rank` -- runs on each engine: one rank of a small decoder LM
  (:mod:`workbench.models`) trained on Markov-chain tokens (:mod:`workbench.models.data`), each
  rank on its slice of the global batch, so every strategy computes the same global step.
  Every step is appended to the run store as it happens.
* :func:`run_training` -- plans the launch, starts engines, watches progress, and records
  the outcome: done, or failed with the error and the rank at fault. A step that does not
  finish within ``step_timeout_s`` (a hung collective, MLX #4475) fails the run instead of
  hanging the notebook.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from workbench.core.buckets import plan_buckets
from workbench.core.shards import plan_shards
from workbench.core.specs import ModelSpec
from workbench.core.strategies import RUN_STRATEGIES
from workbench.core.units import MiB
from workbench.launch.engines import EngineFailure, EngineRun, run_on_fresh_ports
from workbench.models.init import LMConfig, lm_param_shapes
from workbench.runs.store import RunStore

STRATEGIES = RUN_STRATEGIES  # (workbench.core.strategies)
#: Fields added after runs were stored: :meth:`RunSpec.to_dict` leaves them out at these defaults,
#: so a run's id (a hash of its dict) and every stored record stay valid.
LATER_DEFAULTS = {"num_microbatches": 1, "defer_sync": True}
DEFAULT_MODEL = dict(vocab_size=64, seq_len=32, dim=64, num_layers=2, num_heads=4, mlp_dim=128)


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """One training run. Field names are what error messages and stored records use."""

    framework: str = "mlx"
    strategy: str = "ddp"
    num_ranks: int = 2
    steps: int = 200
    global_batch: int = 16
    model: dict = field(default_factory=lambda: dict(DEFAULT_MODEL))
    optimizer: str = "adamw"
    learning_rate: float = 3e-3
    weight_decay: float = 0.0
    precision: str = "float32"
    communication_size: int = 32 * MiB
    max_norm: float | None = None
    init_seed: int = 0
    data_seed: int = 0
    concentration: float = 0.1
    num_microbatches: int = 1
    defer_sync: bool = True

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"RunSpec.{name}={getattr(self, name)!r}: {why}")

        if self.framework not in ("mlx", "jax"):
            raise bad("framework", "choose 'mlx' or 'jax'")
        if self.strategy not in STRATEGIES:
            raise bad("strategy", f"unknown strategy; choose one of {', '.join(STRATEGIES)}")
        for name in ("num_ranks", "steps", "global_batch", "num_microbatches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise bad(name, "must be an integer >= 1")
        if self.global_batch % self.num_ranks:
            raise bad("global_batch", f"must be divisible by num_ranks={self.num_ranks} (each rank takes an equal slice)")
        if self.global_batch % (self.num_ranks * self.num_microbatches):
            raise bad("num_microbatches", f"must divide each rank's batch of {self.global_batch // self.num_ranks} "
                                          f"(global_batch={self.global_batch} / num_ranks={self.num_ranks})")
        if not isinstance(self.defer_sync, bool):
            raise bad("defer_sync", "must be True (sync once per step) or False (sync every micro-batch)")
        if self.num_microbatches == 1:  # one micro-batch syncs once either way: one run, one id
            object.__setattr__(self, "defer_sync", True)
        if self.optimizer not in ("sgd", "adamw"):
            raise bad("optimizer", "choose 'sgd' or 'adamw'")
        if self.precision not in ("float32", "bfloat16"):
            raise bad("precision", "choose 'float32' or 'bfloat16'")
        def real(name: str, low: float, *, strict: bool, optional: bool = False) -> None:
            value = getattr(self, name)
            if optional and value is None:
                return
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not ok or (value <= low if strict else value < low):
                raise bad(name, f"must be a finite number {'>' if strict else '>='} {low}" + (" or None" if optional else ""))

        real("learning_rate", 0, strict=True)
        real("max_norm", 0, strict=True, optional=True)
        real("weight_decay", 0, strict=False)
        real("concentration", 0, strict=True)
        for name in ("init_seed", "data_seed", "communication_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or (name != "communication_size" and value < 0):
                raise bad(name, "must be an integer" + ("" if name == "communication_size" else " >= 0"))
        config = self.config  # validates the model fields, naming them
        if self.strategy != "ddp":  # FSDP layouts, and ZeRO-3's per-array rows, must tile every array
            layout = "flat" if self.strategy == "fsdp-flat" else "row"
            spec = ModelSpec.from_shapes(dict(lm_param_shapes(config)), name="lm", dtype=self.precision)
            try:
                plan_shards(plan_buckets(spec, self.communication_size), self.num_ranks, layout)
            except ValueError as err:
                raise bad("strategy", str(err)) from None

    @property
    def config(self) -> LMConfig:
        try:
            return LMConfig(**self.model)
        except TypeError as err:
            raise ValueError(f"RunSpec.model: {err}") from None

    @property
    def micro_batch_size(self) -> int:
        """Sequences per rank in one micro-batch."""
        return self.global_batch // (self.num_ranks * self.num_microbatches)

    def to_dict(self) -> dict:
        """The spec as stored (and hashed into the run id); :data:`LATER_DEFAULTS` at their defaults are left out."""
        out = asdict(self)
        for name, default in LATER_DEFAULTS.items():
            if out[name] == default and type(out[name]) is type(default):
                del out[name]
        return out


def peak_rss_bytes() -> int:
    """Peak resident memory of this process in bytes (``ru_maxrss``; psutil's current RSS if unavailable)."""
    try:
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, KiB on Linux
    except (ImportError, OSError):
        import psutil

        return int(psutil.Process().memory_info().rss)


def _peak_memory_mlx() -> int:
    """Peak bytes of MLX arrays (``mx.get_peak_memory``), since the run started."""
    import mlx.core as mx

    return int(mx.get_peak_memory())


#: Kind of collective -> the key the MLX trainers' ``report`` counts it under (per step, per rank).
COLLECTIVE_KEYS = {"all_reduce": "num_all_sums", "reduce_scatter": "num_reduce_scatters",
                   "all_gather": "num_all_gathers"}


def collective_count(report: dict) -> int:
    """Collectives one rank issued in its last step, from an MLX trainer's ``report``."""
    return int(sum(report.get(key, 0) for key in COLLECTIVE_KEYS.values()))


def _train_mlx(spec: RunSpec, handle) -> dict:
    import mlx.core as mx

    from workbench.adapters.mlx.accum import make_trainer, make_zero3_trainer
    from workbench.adapters.mlx.base import make_optimizer as make_mlx_optimizer
    from workbench.adapters.mlx.fsdp import has_sum_scatter, optimizer_state_bytes
    from workbench.models.data import make_markov_chain, rank_slice, sample_batch
    from workbench.models.init import init_lm_params
    from workbench.models.mlx_lm import MLXLM, lm_loss, load_params

    group = mx.distributed.init(backend=os.environ.get("WORKBENCH_BACKEND", "ring"), strict=True)
    rank, size = group.rank(), group.size()
    cfg = spec.config
    model = MLXLM(cfg)
    load_params(model, init_lm_params(cfg, spec.init_seed))
    if spec.precision == "bfloat16":
        model.set_dtype(mx.bfloat16)
    opt = make_mlx_optimizer(spec.optimizer, spec.learning_rate, weight_decay=spec.weight_decay)
    # Always ask for the norm (an infinite max_norm clips nothing) so every run records it.
    max_norm = spec.max_norm if spec.max_norm is not None else math.inf
    accum = dict(max_norm=max_norm, num_microbatches=spec.num_microbatches, defer_sync=spec.defer_sync)
    if spec.strategy == "fsdp-full":  # ZeRO-3: one unit per transformer block, plus the root
        trainer = make_zero3_trainer(model, opt, group, reshard_after_forward=True, **accum)
    else:
        trainer = make_trainer(model, opt, group, strategy="ddp" if spec.strategy == "ddp" else "fsdp",
                               communication_size=spec.communication_size,
                               layout="flat" if spec.strategy == "fsdp-flat" else "row", **accum)
    # The trainer evaluates every micro-batch's backward before its sync starts (deferred: before the
    # one sync of the step), so activations are gone before the collective buffers and update copies
    # appear (the phases of workbench.estimate.memory), and reports the seconds spent syncing. Full sharding's
    # collectives run inside forward and backward: its sync time is not separable (None).
    chain = make_markov_chain(cfg.vocab_size, seed=spec.data_seed, concentration=spec.concentration)
    mx.reset_peak_memory()
    for step in range(spec.steps):
        local = rank_slice(sample_batch(chain, step, spec.global_batch, cfg.seq_len, seed=spec.data_seed), rank, size)
        inputs, targets = mx.array(local[:, :-1]), mx.array(local[:, 1:])
        t0 = time.perf_counter()
        loss, norm = trainer.step(lm_loss, inputs, targets)
        t1 = time.perf_counter()
        handle.append_steps([{
            "step": step, "rank": rank, "loss": loss.item(), "grad_norm": norm.item(),
            "step_time_s": t1 - t0, "sync_time_s": trainer.report.get("sync_time_s"),
            "num_collectives": collective_count(trainer.report),
            "peak_rss_bytes": peak_rss_bytes(), "peak_array_bytes": _peak_memory_mlx(),
        }])
    report = trainer.report
    params = trainer.model.parameters()  # under fsdp-full: this rank's rows
    return {"rank": rank, "backend": os.environ.get("WORKBENCH_BACKEND", "ring"),
            "capabilities": {"sum_scatter": has_sum_scatter(group), "group_split": _can_split(group)},
            "collective_path": report.get("reduce_scatter_path") or "all_reduce",
            "ring_transport": report.get("ring_transport"), "peak_rss_bytes": peak_rss_bytes(),
            "peak_array_bytes": _peak_memory_mlx(),
            "collectives": {kind: int(report.get(key, 0)) for kind, key in COLLECTIVE_KEYS.items()},
            "measured_memory": {"parameters": _nbytes(params), "optimizer_state": optimizer_state_bytes(opt),
                                "peak": _peak_memory_mlx(), "peak_source": "mx.get_peak_memory"},
            "versions": _versions()}


def _nbytes(tree) -> int:
    """Bytes of the MLX arrays in ``tree`` on this rank."""
    from mlx.utils import tree_flatten

    return int(sum(v.nbytes for _, v in tree_flatten(tree)))


def _can_split(group) -> bool:
    """Whether the backend can split groups (HSDP); ring cannot."""
    try:
        group.split(0)
        return True
    except RuntimeError:
        return False


def _versions() -> dict:
    from importlib import metadata

    out = {}
    for dist in ("mlx", "jax", "jaxlib", "flax", "optax", "numpy", "fsdp-workbench"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def train_rank(spec_dict: dict, runs_root: str, run_id: str) -> dict:
    """One rank of a run (executed on an engine whose environment comes from the launch plan)."""
    spec = RunSpec(**spec_dict)
    handle = RunStore(Path(runs_root)).open(run_id)
    if spec.framework == "mlx":
        return _train_mlx(spec, handle)
    from workbench.ranks.train_jax import train_jax

    return train_jax(spec, handle)


@dataclass(frozen=True)
class RunOutcome:
    """What became of a run: ``status`` is "done", "failed" or "skipped" (already done)."""

    run_id: str
    status: str
    error: str | None = None
    rank: int | None = None
    seconds: float = 0.0
    engines_ready_s: float = 0.0


class StepWatchdog:
    """Fails a run whose steps stop arriving (polls the size of its steps file, cheaply)."""

    def __init__(self, steps_path: Path, step_timeout_s: float, startup_timeout_s: float,
                 progress: Callable[[int], None] | None = None, num_ranks: int = 1):
        self.path, self.step_timeout_s, self.startup_timeout_s = steps_path, step_timeout_s, startup_timeout_s
        self.progress, self.num_ranks = progress, num_ranks
        self.size, self.lines, self.last_change = -1, 0, time.monotonic()

    def __call__(self) -> None:
        size = self.path.stat().st_size if self.path.exists() else 0
        now = time.monotonic()
        if size != self.size:
            self.size, self.last_change = size, now
            self.lines = self.path.read_bytes().count(b"\n") if size else 0
            if self.progress is not None:
                self.progress(self.lines // self.num_ranks)
            return
        limit = self.step_timeout_s if self.lines else self.startup_timeout_s
        if now - self.last_change > limit:
            step = self.lines // self.num_ranks
            raise EngineFailure(
                f"no step finished for {limit:.0f} s after step {step - 1 if step else 'start'} "
                f"(a hung collective? MLX ring all_sum is known to deadlock, MLX #4475); engines stopped", None)


def _has_steps(steps_path: Path) -> bool:
    return steps_path.exists() and steps_path.stat().st_size > 0


def run_training(spec: RunSpec, runs_root: Path | str, *, step_timeout_s: float = 60.0, startup_timeout_s: float = 180.0,
                 timeout_s: float = 3600.0, progress: Callable[[int], None] | None = None,
                 on_engines: Callable[[EngineRun], None] | None = None, skip_done: bool = True) -> RunOutcome:
    """Run ``spec`` on ``spec.num_ranks`` local engines and record it under ``runs_root``.

    Args:
        spec: The run (already validated: a bad spec never reaches an engine).
        runs_root: The run store's folder.
        step_timeout_s: Longest wait for the next step once the first has finished.
        startup_timeout_s: Longest wait for the first step (imports, compilation).
        timeout_s: Longest wait for the whole run.
        progress: Called with the number of steps every rank has finished, as they arrive.
        on_engines: Called with the started engines (tests use it to inject faults).
        skip_done: Return at once if the store already holds this spec, done.

    Returns:
        A :class:`RunOutcome`; a failed run is recorded as failed (steps kept), not raised.
    """
    store = RunStore(Path(runs_root))
    spec_dict = spec.to_dict()
    if skip_done and store.is_done(spec_dict):
        from workbench.runs.store import run_id_for

        return RunOutcome(run_id_for(spec_dict), "skipped")
    from workbench.runs.estimate import estimate_run_memory

    handle = store.create(spec_dict, meta={"backend": "ring" if spec.framework == "mlx" else "gloo",
                                           "memory_estimate": estimate_run_memory(spec).as_dict()})
    t0 = time.monotonic()
    steps_path = handle.folder / "steps.jsonl"

    def train(engines: EngineRun) -> tuple[list, float]:
        if on_engines is not None:
            on_engines(engines)
        watchdog = StepWatchdog(steps_path, step_timeout_s, startup_timeout_s, progress, spec.num_ranks)
        return (engines.apply(train_rank, [(spec_dict, str(store.root), handle.run_id)] * spec.num_ranks,
                              timeout_s=timeout_s, on_poll=watchdog, poll_s=0.1), engines.started_s)

    try:
        results, ready_s = run_on_fresh_ports(spec.num_ranks, spec.framework, train,
                                              may_retry=lambda: not _has_steps(steps_path))
    except EngineFailure as err:
        handle.fail(str(err), err.rank)
        return RunOutcome(handle.run_id, "failed", str(err), err.rank, time.monotonic() - t0)
    except BaseException as err:  # interrupted: recorded, then re-raised
        handle.fail(f"{type(err).__name__}: {err}", None)
        raise
    handle.finish({"ranks": results, "engines_ready_s": ready_s})
    return RunOutcome(handle.run_id, "done", seconds=time.monotonic() - t0, engines_ready_s=ready_s)

"""A model's measured profile (issue 26): its record, and where it is cached.

A rank's peak is mostly activations, and for a model the workbench did not write no formula knows them.
So the model is measured once, on one process, with the threads a rank will have
(:func:`workbench.launch.profile.profile_model` runs :mod:`workbench.ranks.profile_mlx` or
:mod:`workbench.ranks.profile_jax`): activation bytes and forward-and-backward seconds at a few micro-batch
sizes, each fitted as a line in the size (:func:`~workbench.estimate.profile_fit.fit_linear`), the
optimizer update's seconds per parameter byte, and the rank's real DDP step on a group of one, whose time
beyond those parts is the step's overhead (:attr:`ModelProfile.step_overhead_s`). Where a run puts several
ranks on a host, as many profiling processes measure at once (``co_runners``), so the times hold the
contention for the cores that the ranks will meet. :func:`workbench.runs.profile_estimate.estimate_with_profile`
makes a run's estimate from it.

The cache: one JSON file per profile, ``<runs root>/.profiles/<framework>-<key>.json``, beside the runs
(a dotted folder, which :func:`workbench.runs.tables.load_runs` passes over), written atomically. The key
hashes what the measurement depends on (:func:`profile_key_fields`): the model (the built-in LM's config,
or the factory and its source's sha256), dtype, sequence length, vocabulary, optimizer, framework and its
version, threads, the processes measuring at once, MLX's BLAS, and :data:`PROFILE_VERSION` (a profile stored by
older code is never found under a newer key: it is measured again). A cache file that cannot be read as a profile is an
error naming it, and it is left in place: nothing stored is overwritten unasked (remove it, or ``refresh=True``).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from workbench.adapters.mlx.blas import expected_blas
from workbench.estimate.profile_fit import LinearFit, fit_from_dict, fit_linear
from workbench.runs.atomic import write_atomic

#: The rank's steps timed in threes: the step, and the bare forward and backward and the update before it.
STEP_SAMPLES = ("step_s_samples", "step_bare_s_samples", "step_update_s_samples")
#: The folder under a run store's root that holds the profiles.
PROFILE_DIR = ".profiles"
#: The record's layout and what its times mean (in the key; another version's file is refused, naming it).
PROFILE_VERSION = 8


class ProfileError(ValueError):
    """A cached profile that cannot be used: ``path`` names the file, which is left as it was."""

    def __init__(self, path: Path, why: str):
        super().__init__(f"model profile {path}: {why} (the file is kept: remove it, or profile again with refresh=True)")
        self.path = Path(path)


def profile_key_fields(spec: Any, threads: int | None, co_runners: int = 1, environ: Mapping | None = None) -> dict:
    """What a profile of ``spec``'s model depends on (a RunSpec or its dict): the model, dtype, tokens,
    optimizer, framework and its installed version, ``threads`` (a rank's ``OMP_NUM_THREADS``), ``co_runners``
    (profiling processes measuring at once: the ranks per host), MLX's BLAS under ``environ`` (default this
    process's) and :data:`PROFILE_VERSION`."""
    fields = spec if isinstance(spec, Mapping) else spec.to_dict()
    framework = fields["framework"]
    if fields.get("model_factory") is not None:
        model = {"factory": fields["model_factory"], "source_sha256": fields.get("model_source_sha256")}
    else:
        model = {"lm": dict(fields["model"])}
    try:
        version = metadata.version(framework)
    except metadata.PackageNotFoundError:
        version = None
    blas = {"blas": expected_blas(environ)} if framework == "mlx" else {}  # MLX's compute time is its BLAS's
    return {"model": model, "precision": fields["precision"], "seq_len": fields["model"]["seq_len"],
            "vocab_size": fields["model"]["vocab_size"], "optimizer": fields["optimizer"], "framework": framework,
            "framework_version": version, "threads": threads, "co_runners": co_runners, **blas,
            "profile_version": PROFILE_VERSION}


def profile_key(key_fields: Mapping[str, Any]) -> str:
    """16 hex digits of the sha256 of ``key_fields`` as canonical JSON."""
    return hashlib.sha256(json.dumps(key_fields, sort_keys=True).encode()).hexdigest()[:16]


def profile_path(runs_root: str | Path, key_fields: Mapping[str, Any]) -> Path:
    """``<runs_root>/.profiles/<framework>-<key>.json``."""
    return Path(runs_root) / PROFILE_DIR / f"{key_fields['framework']}-{profile_key(key_fields)}.json"


@dataclass(frozen=True, kw_only=True)
class ModelProfile:
    """One model measured on one process. Bytes and seconds are per micro-batch of ``b`` sequences.

    Attributes:
        key_fields: What was profiled (:func:`profile_key_fields`). key: Their hash (:func:`profile_key`).
        micro_batch_sizes: The sizes measured, ascending.
        activation_samples: Per size, each measurement's activation bytes: the peak above the resident
            parameters, optimizer state and batch, less the gradients (``truth_source`` says how read).
        compute_s_samples: Per size, each measurement's forward-and-backward seconds.
        forward_s_samples: Per size, each measurement's forward seconds alone (what a step that reshards its
            units after forward runs again in backward); None in a profile stored before they were measured.
        cores: CPUs of the machine that measured it (``os.cpu_count()``), or None: with ``threads`` it says
            whether a run's ranks had the cores the profile had.
        zero3_rise_samples: MLX: per size, how far the ZeRO-3 trainer's step on a group of one (each transformer
            block a unit, recomputed in backward) raised the peak above the arrays live before it; None where the
            model has no blocks, or for JAX.
        activation_fit: Bytes against ``b``, fitted to each size's largest sample.
        zero3_rise_fit: Bytes against ``b`` of ``zero3_rise_samples`` (each size's largest), or None.
        compute_fit: Seconds against ``b``, fitted to each size's median.
        forward_fit: The same of the forward alone, or None.
        step_s_samples: At the smallest size, seconds of the rank's whole DDP step on a group of one (timed as
            ``train_mlx`` / ``train_jax`` time it); None where not measured.
        step_bare_s_samples, step_update_s_samples: Beside each, the bare forward and backward and the update
            timed just before it.
        co_runners: Profiling processes that measured at once (a run's ranks per host); all their seconds are here.
        update_beside_backward_bytes: JAX: what the whole DDP step holds at its peak beyond forward and backward alone
            (the update XLA schedules beside the backward), at the largest size; None where not measured.
        parameter_bytes, gradient_bytes, optimizer_state_bytes: The whole model's, on the profiling process.
        update_s: The optimizer's update of the whole model, seconds (median).
        plan_activation_bytes: JAX: per size, XLA's ``memory_analysis()`` plan of the same; MLX: None.
        mesh_plan_activation_bytes: JAX: per size, XLA's plan per device of the same on a mesh of two devices, as a
            rank of a run of two or more has (XLA plans it differently: 20.6 MiB against 24.6 on one device, at 8
            sequences of a Qwen3-shaped LM; the 2-device DDP step 20.3 against 24.3); None where not compiled.
            :meth:`activation_fit_for` such a run scales each size's truth by the two plans' ratio.
        cost_s: Wall seconds the profile took (process start, imports, compilation, measurements).
        cost_peak_rss_bytes: The profiling process's peak resident memory.
        cost_peak_array_bytes: MLX: the largest ``mx.get_peak_memory`` seen; JAX: None.
        versions: Packages installed where it was measured.
    """

    key_fields: dict
    micro_batch_sizes: tuple[int, ...]
    activation_samples: tuple[tuple[int, ...], ...]
    compute_s_samples: tuple[tuple[float, ...], ...]
    parameter_bytes: int
    gradient_bytes: int
    optimizer_state_bytes: int
    update_s: float
    truth_source: str
    plan_activation_bytes: tuple[int | None, ...] | None
    cost_s: float
    cost_peak_rss_bytes: int
    cost_peak_array_bytes: int | None
    versions: dict = field(default_factory=dict)
    forward_s_samples: tuple[tuple[float, ...], ...] | None = None
    cores: int | None = None
    step_s_samples: tuple[float, ...] | None = None
    step_bare_s_samples: tuple[float, ...] | None = None
    step_update_s_samples: tuple[float, ...] | None = None
    co_runners: int = 1
    update_beside_backward_bytes: int | None = None
    zero3_rise_samples: tuple[tuple[int, ...], ...] | None = None
    mesh_plan_activation_bytes: tuple[int | None, ...] | None = None
    activation_fit: LinearFit = field(init=False)
    mesh_activation_fit: LinearFit | None = field(init=False)
    zero3_rise_fit: LinearFit | None = field(init=False)
    compute_fit: LinearFit = field(init=False)
    forward_fit: LinearFit | None = field(init=False)

    def __post_init__(self) -> None:
        sizes = self.micro_batch_sizes
        if len(self.activation_samples) != len(sizes) or len(self.compute_s_samples) != len(sizes):
            raise ValueError(f"a profile needs samples for each of the micro-batch sizes {list(sizes)}")
        object.__setattr__(self, "activation_fit", fit_linear(
            sizes, [max(s) for s in self.activation_samples], what="activation_bytes"))
        object.__setattr__(self, "compute_fit", fit_linear(
            sizes, [sorted(s)[len(s) // 2] for s in self.compute_s_samples], what="compute_s"))
        one, mesh = self.plan_activation_bytes, self.mesh_plan_activation_bytes
        if mesh is not None and len(mesh) != len(sizes):
            raise ValueError(f"a profile's mesh_plan_activation_bytes need one for each of the sizes {list(sizes)}")
        scaled = mesh is not None and one is not None and len(mesh) == len(one) == len(sizes) and all(
            a and b and a > 0 and b > 0 for a, b in zip(one, mesh))
        object.__setattr__(self, "mesh_activation_fit", fit_linear(
            sizes, [max(s) * b / a for s, a, b in zip(self.activation_samples, one, mesh)],
            what="activation_bytes") if scaled else None)
        zero3 = self.zero3_rise_samples
        if zero3 is not None and len(zero3) != len(sizes):
            raise ValueError(f"a profile's zero3_rise_samples need one row for each of the sizes {list(sizes)}")
        object.__setattr__(self, "zero3_rise_fit", None if zero3 is None else fit_linear(
            sizes, [max(s) for s in zero3], what="zero3_rise_bytes"))
        forward = self.forward_s_samples
        if forward is not None and len(forward) != len(sizes):
            raise ValueError(f"a profile's forward_s_samples need one row for each of the sizes {list(sizes)}")
        object.__setattr__(self, "forward_fit", None if forward is None else fit_linear(
            sizes, [sorted(s)[len(s) // 2] for s in forward], what="forward_s"))
        triple = [getattr(self, name) for name in STEP_SAMPLES]
        if any(t is None for t in triple) != all(t is None for t in triple) or (
                triple[0] is not None and (not triple[0] or len({len(t) for t in triple}) > 1)):
            raise ValueError(f"a profile's {', '.join(STEP_SAMPLES)}: as many seconds each (one or more), or all None")
        if isinstance(self.co_runners, bool) or not isinstance(self.co_runners, int) or self.co_runners < 1:
            raise ValueError(f"co_runners={self.co_runners!r}: an integer >= 1")

    @property
    def key(self) -> str:
        return profile_key(self.key_fields)

    @property
    def framework(self) -> str:
        return self.key_fields["framework"]

    @property
    def update_s_per_param_byte(self) -> float:
        """Seconds of the optimizer's update per byte of parameters updated."""
        return self.update_s / self.parameter_bytes if self.parameter_bytes else 0.0

    def activation_fit_for(self, num_ranks: int = 1) -> LinearFit:
        """A run of ``num_ranks``'s activation line: above one, :attr:`mesh_activation_fit` where there is one."""
        return self.mesh_activation_fit if num_ranks > 1 and self.mesh_activation_fit is not None else self.activation_fit

    def activation_bytes_at(self, micro_batch_size: int, num_ranks: int = 1) -> int:
        """Activation bytes of one micro-batch of ``micro_batch_size`` sequences on ``num_ranks`` ranks (>= 0)."""
        return max(0, round(self.activation_fit_for(num_ranks).at(micro_batch_size)))

    def compute_s_at(self, micro_batch_size: int) -> float:
        """Forward and backward seconds of one micro-batch of ``micro_batch_size`` sequences (>= 0)."""
        return max(0.0, self.compute_fit.at(micro_batch_size))

    @property
    def step_overhead_s(self) -> float | None:
        """Seconds the trainer's step spends beyond forward, backward and the whole model's update (>= 0): the median
        of each timed step less the bare forward and backward and the update timed just before it (at the smallest
        size: it does not grow with b, and there the compute's noise is least). None where not timed."""
        if self.step_s_samples is None:
            return None
        over = np.subtract(np.subtract(self.step_s_samples, self.step_bare_s_samples), self.step_update_s_samples)
        return max(0.0, float(np.median(over)))

    def forward_s_at(self, micro_batch_size: int) -> float:
        """Forward seconds of one micro-batch (>= 0); a third of :meth:`compute_s_at` where the profile has no
        forward measured (a backward costs about two forwards)."""
        if self.forward_fit is None:
            return self.compute_s_at(micro_batch_size) / 3
        return max(0.0, self.forward_fit.at(micro_batch_size))

    def to_dict(self) -> dict:
        out = {"version": PROFILE_VERSION, "key": self.key, "key_fields": self.key_fields,
               "micro_batch_sizes": list(self.micro_batch_sizes),
               "activation_samples": [list(s) for s in self.activation_samples],
               "zero3_rise_samples": None if self.zero3_rise_samples is None
               else [list(s) for s in self.zero3_rise_samples],
               "compute_s_samples": [list(s) for s in self.compute_s_samples],
               "forward_s_samples": None if self.forward_s_samples is None else [list(s) for s in self.forward_s_samples],
               **{name: None if getattr(self, name) is None else list(getattr(self, name))
                  for name in STEP_SAMPLES},
               **{name: None if getattr(self, name) is None else list(getattr(self, name))
                  for name in ("plan_activation_bytes", "mesh_plan_activation_bytes")}}
        for name in ("parameter_bytes", "gradient_bytes", "optimizer_state_bytes", "update_s", "truth_source",
                     "cost_s", "cost_peak_rss_bytes", "cost_peak_array_bytes", "versions", "cores", "co_runners",
                     "step_overhead_s", "update_beside_backward_bytes"):
            out[name] = getattr(self, name)
        out["activation_fit"], out["compute_fit"] = self.activation_fit.to_dict(), self.compute_fit.to_dict()
        out["forward_fit"] = None if self.forward_fit is None else self.forward_fit.to_dict()
        return out


def profile_from_measurements(measured: Mapping[str, Any], key_fields: Mapping[str, Any],
                              cost_s: float) -> ModelProfile:
    """A :class:`ModelProfile` from what a profiling program wrote and the seconds its process took."""
    return ModelProfile(
        key_fields=dict(key_fields), micro_batch_sizes=tuple(measured["micro_batch_sizes"]),
        activation_samples=tuple(tuple(int(v) for v in s) for s in measured["activation_samples"]),
        compute_s_samples=tuple(tuple(float(v) for v in s) for s in measured["compute_s_samples"]),
        parameter_bytes=int(measured["parameter_bytes"]), gradient_bytes=int(measured["gradient_bytes"]),
        optimizer_state_bytes=int(measured["optimizer_state_bytes"]), update_s=float(measured["update_s"]),
        truth_source=str(measured["truth_source"]),
        **{name: None if measured.get(name) is None else tuple(measured[name])
           for name in ("plan_activation_bytes", "mesh_plan_activation_bytes")},
        cost_s=float(cost_s), cost_peak_rss_bytes=int(measured["peak_rss_bytes"]),
        cost_peak_array_bytes=measured.get("peak_array_bytes"), versions=dict(measured.get("versions") or {}),
        forward_s_samples=None if measured.get("forward_s_samples") is None
        else tuple(tuple(float(v) for v in s) for s in measured["forward_s_samples"]),
        cores=None if measured.get("cores") is None else int(measured["cores"]),
        **{name: None if measured.get(name) is None else tuple(float(v) for v in measured[name])
           for name in STEP_SAMPLES},
        co_runners=int(measured.get("co_runners") or 1),
        update_beside_backward_bytes=None if measured.get("update_beside_backward_bytes") is None
        else int(measured["update_beside_backward_bytes"]),
        zero3_rise_samples=None if measured.get("zero3_rise_samples") is None
        else tuple(tuple(int(v) for v in s) for s in measured["zero3_rise_samples"]))


def save_profile(path: str | Path, profile: ModelProfile) -> Path:
    """Write ``profile`` to ``path`` atomically (its folder made if missing)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, json.dumps(profile.to_dict(), indent=1))


def load_profile(path: str | Path) -> ModelProfile:
    """The profile stored at ``path``.

    Raises:
        ProfileError: naming the file: unreadable, not JSON, another version, a field missing or of the wrong
            type, or a stored fit that is not the fit of its own samples (an edited file).
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ProfileError(path, f"cannot be read as JSON ({type(err).__name__}: {err})") from None
    if not isinstance(data, dict) or data.get("version") != PROFILE_VERSION:
        raise ProfileError(path, f"not a profile of version {PROFILE_VERSION}")
    try:
        measured = {**data, "peak_rss_bytes": data["cost_peak_rss_bytes"],
                    "peak_array_bytes": data["cost_peak_array_bytes"]}
        profile = profile_from_measurements(measured, data["key_fields"], data["cost_s"])
        stored = (fit_from_dict(data["activation_fit"], what="activation_fit"),
                  fit_from_dict(data["compute_fit"], what="compute_fit"))
        forward = data.get("forward_fit")
        forward = None if forward is None else fit_from_dict(forward, what="forward_fit")
    except (KeyError, TypeError, ValueError) as err:
        raise ProfileError(path, f"a field is missing or malformed ({type(err).__name__}: {err})") from None
    if data.get("key") != profile.key:
        raise ProfileError(path, f"its key {data.get('key')!r} is not the hash of its key_fields ({profile.key})")
    fits_agree = all(_close(a, b) for a, b in zip(stored, (profile.activation_fit, profile.compute_fit)))
    if not fits_agree or (forward is None) != (profile.forward_fit is None) or (
            forward is not None and not _close(forward, profile.forward_fit)):
        raise ProfileError(path, "its stored fits are not the fits of its samples (edited by hand?)")
    return profile


def _close(a: LinearFit, b: LinearFit) -> bool:
    pairs = zip(a.to_dict().values(), b.to_dict().values())
    return all(math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9) for x, y in pairs)

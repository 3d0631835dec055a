"""Wrapping plans for MLX's ``fully_shard`` (mlx >= 0.32.1): units, their collectives, and readiness.

``mlx.nn.fully_shard(module, group=None, compute_dtype=None)`` makes one module a unit: its own
parameters (those no wrapped child holds) are stored as this rank's rows along axis 0, gathered by
one ``all_gather`` per call in forward (all of them concatenated, cast to ``compute_dtype``) and
reduce-scattered by one ``sum_scatter`` per call in backward (``/ N``). The gathered weights stay
referenced by the backward graph, so every unit's full weights are resident from its forward until
its backward: ``reshard_after_forward=False`` in FSDP2's terms. Children must be wrapped before their
parents, the root last.

:func:`plan_fully_shard` proposes the units (each transformer block, or the modules named, plus the
root for what is left) and draws them the way :mod:`workbench.core.buckets` draws buckets: bytes per
unit, collectives per step, the largest gathered unit. :func:`check_fully_shard` lists every
parameter ``fully_shard`` would refuse or break, in MLX's own wording, before anything starts.

Pure: standard library only (specs from :mod:`workbench.core.specs`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from workbench.core.checks import integer
from workbench.core.specs import DTYPE_BYTES, ModelSpec, canonical_dtype

#: A transformer block: an entry of a ``layers``, ``blocks`` or ``h`` (GPT-2) list.
BLOCK_RE = re.compile(r"^(.*?(?:^|\.)(?:layers|blocks|h)\.\d+)\.")
ROOT = "root"
FLOAT_DTYPES = ("float64", "float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")


@dataclass(frozen=True, kw_only=True)
class Refusal:
    """One parameter ``fully_shard`` cannot shard.

    Attributes:
        path: Full dotted path in the unwrapped model.
        unit: The unit that would hold it (``"root"`` for the root).
        shape: Its shape.
        dtype: Its dtype.
        reason: ``"indivisible"`` (axis 0 not divisible by N), ``"scalar"`` (0-d), ``"quantized"`` (the
            packed weight of a quantized layer: the gather concatenates it with the unit's floats and
            promotes it to float, which ``quantized_matmul`` then rejects; measured on mlx 0.32.4, where
            MLX itself lets the layer through) or ``"integer"`` (any other integer array: promoted the same way).
        num_shards: N.
    """

    path: str
    unit: str
    shape: tuple[int, ...]
    dtype: str
    reason: str
    num_shards: int

    @property
    def message(self) -> str:
        """MLX's wording (``FullyShardedModule.__init__``) with the full path, or ours for what MLX lets through."""
        n, p = self.num_shards, self.path
        if self.reason == "scalar":
            return f"Cannot shard parameter '{p}' because it is a scalar."
        if self.reason == "indivisible":
            return (f"Cannot shard parameter '{p}' with shape {self.shape} across {n} devices: "
                    f"axis 0 must be divisible by {n}.")
        if self.reason == "quantized":
            return (f"Cannot shard parameter '{p}' with shape {self.shape}: it is the packed {self.dtype} weight of a "
                    f"quantized layer, which fully_shard's gather would promote to float (quantized_matmul then "
                    f"raises); keep '{p.rpartition('.')[0]}' out of every unit, or dequantize it.")
        return (f"Cannot shard parameter '{p}' with shape {self.shape}: it is {self.dtype}, which fully_shard's gather "
                f"would promote to float.")


@dataclass(frozen=True, kw_only=True)
class Unit:
    """One ``fully_shard`` unit and what it costs per step.

    Attributes:
        name: Module path (``"layers.3"``), or ``"root"``.
        paths: Its own parameters (not those of units inside it), in spec order.
        num_params: Elements of those parameters.
        param_bytes: Their bytes at rest, whole (each rank stores ``param_bytes / N``).
        gathered_dtype: The dtype of the gathered weights: ``compute_dtype``, else the unit's one dtype,
            else what ``mx.concatenate`` promotes mixed dtypes to.
        gathered_bytes: Bytes of the gathered weights (``num_params`` in ``gathered_dtype``).
        num_all_gathers: All-gathers per step (one per call, per micro-batch).
        num_reduce_scatters: ``sum_scatter`` calls per step (one per gather: the custom VJP).
    """

    name: str
    paths: tuple[str, ...]
    num_params: int
    param_bytes: int
    gathered_dtype: str
    gathered_bytes: int
    num_all_gathers: int
    num_reduce_scatters: int


@dataclass(frozen=True, kw_only=True)
class FullyShardPlan:
    """Units of one model over ``num_shards`` ranks, in wrapping order (innermost first, the root last).

    Attributes:
        num_shards: N.
        compute_dtype: ``fully_shard``'s ``compute_dtype`` (``None``: gathered as stored).
        units: The units.
        refusals: What :func:`check_fully_shard` found (empty when every parameter can be sharded).
    """

    num_shards: int
    compute_dtype: str | None
    units: tuple[Unit, ...]
    refusals: tuple[Refusal, ...] = ()

    @property
    def wrap_order(self) -> list[str]:
        """Module paths to pass to ``fully_shard`` one after another (``"root"``: the model itself)."""
        return [u.name for u in self.units]

    @property
    def largest_unit(self) -> Unit:
        """The unit with the most gathered bytes (the first of equals)."""
        return max(self.units, key=lambda u: u.gathered_bytes)

    @property
    def resident_gathered_bytes(self) -> int:
        """Gathered weights alive at the step's peak: every unit's, forward to backward (bytes)."""
        return sum(u.gathered_bytes for u in self.units)

    @property
    def shard_bytes(self) -> int:
        """This rank's parameters at rest (bytes): each unit's ``param_bytes / N``."""
        return sum(u.param_bytes // self.num_shards for u in self.units)

    def summary(self) -> dict:
        """Counts and bytes per step per rank, the keys of :func:`workbench.core.units.readable`."""
        n = self.num_shards
        moved = sum(u.num_all_gathers * u.gathered_bytes for u in self.units) * (n - 1) // n
        return {"num_units": len(self.units), "num_all_gathers": sum(u.num_all_gathers for u in self.units),
                "num_reduce_scatters": sum(u.num_reduce_scatters for u in self.units),
                "largest_unit": self.largest_unit.name, "largest_gathered_bytes": self.largest_unit.gathered_bytes,
                "resident_gathered_bytes": self.resident_gathered_bytes, "shard_bytes": self.shard_bytes,
                "all_gather_bytes_sent": moved, "reduce_scatter_bytes_sent": moved,
                "num_refusals": len(self.refusals)}


def propose_units(spec: ModelSpec) -> list[str]:
    """Every transformer block of ``spec`` (an entry of a ``layers``, ``blocks`` or ``h`` list), in order."""
    return block_paths(p.path for p in spec)


def block_paths(paths: Iterable[str]) -> list[str]:
    """The module path of every transformer block the parameter ``paths`` hold (the shallowest ``layers``,
    ``blocks`` or ``h`` entry of each: ``model.layers.0`` of ``model.layers.0.mlp.up.weight``), in order: the units
    a fully sharded run wraps, in the plan and in the MLX trainer alike; [] where there are none."""
    out: dict[str, None] = {}
    for path in paths:
        match = BLOCK_RE.match(path)
        if match:
            out.setdefault(match.group(1))
    return list(out)


def _check_units(spec: ModelSpec, units: list[str]) -> list[str]:
    if isinstance(units, str) or not all(isinstance(u, str) and u for u in units) or len(set(units)) != len(units):
        raise ValueError(f"units must be a list of distinct, non-empty module paths such as 'layers.0'; got {units!r}.")
    paths = set(spec.paths)
    for name in units:
        if name == ROOT:
            raise ValueError(f"units: {ROOT!r} is always a unit (whatever no other unit holds); name submodules only.")
        if name in paths:
            raise ValueError(f"units: {name!r} is a parameter, not a module; a unit is a module path such as "
                             f"{name.rsplit('.', 1)[0]!r}.")
        if not any(p.startswith(name + ".") for p in paths):
            depth = name.count(".") + 1
            modules = {".".join(parts[:depth]) for parts in (p.split(".") for p in paths) if len(parts) > depth}
            siblings = [m for m in modules if m.rpartition(".")[0] == name.rpartition(".")[0]]
            raise ValueError(f"units: {name!r} is not a module of {spec.name!r}; modules there: "
                             f"{sorted(siblings or modules)[:8]}.")
    return sorted(units, key=lambda u: -u.count("."))  # innermost first, as fully_shard needs


def unit_of(path: str, units: list[str]) -> str:
    """The innermost unit holding parameter ``path`` (``"root"`` if none)."""
    return max((u for u in units if path.startswith(u + ".")), key=len, default=ROOT)


def _gathered_dtype(dtypes: list[str], compute_dtype: str | None) -> str:
    if compute_dtype is not None:
        return compute_dtype
    kinds = set(dtypes)
    if len(kinds) == 1:
        return dtypes[0]
    floats = [d for d in kinds if d in FLOAT_DTYPES]
    widest = max(floats, key=lambda d: DTYPE_BYTES[d], default=max(kinds, key=lambda d: DTYPE_BYTES[d]))
    # mx.concatenate promotes bfloat16 with float16 to float32 (neither holds the other).
    return "float32" if {"bfloat16", "float16"} <= kinds and DTYPE_BYTES[widest] < 4 else widest


def _quantized_modules(spec: ModelSpec) -> set[str]:
    """Modules with a packed integer ``weight`` beside ``scales`` (``mlx.nn.QuantizedLinear`` and kin)."""
    by_module: dict[str, dict[str, str]] = {}
    for p in spec:
        module, _, leaf = p.path.rpartition(".")
        by_module.setdefault(module, {})[leaf] = p.dtype
    return {m for m, leaves in by_module.items()
            if "scales" in leaves and leaves.get("weight", "float32") not in FLOAT_DTYPES}


def check_fully_shard(spec: ModelSpec, num_shards: int, units: list[str] | None = None) -> list[Refusal]:
    """Every parameter ``fully_shard`` over ``num_shards`` ranks would refuse or break, in spec order.

    MLX raises on the first scalar or indivisible parameter it meets, one unit at a time, only once the
    ranks run; this lists them all, with the unit each would be in, before anything starts.

    Args:
        spec: All the model's parameters (frozen ones too: ``fully_shard`` shards those as well).
        num_shards: N, the group size.
        units: As :func:`plan_fully_shard` (only to name each parameter's unit). Default: the blocks.
    """
    n = integer("num_shards", num_shards, low=1)
    units = propose_units(spec) if units is None else _check_units(spec, units)
    if n == 1:
        return []  # fully_shard over one rank returns the module unchanged
    quantized = _quantized_modules(spec)
    out = []
    for p in spec:
        module, _, leaf = p.path.rpartition(".")
        if module in quantized:
            reason = "quantized" if leaf == "weight" else None  # its scales and biases fail with it
        elif p.dtype not in FLOAT_DTYPES:
            reason = "integer"
        elif not p.shape:
            reason = "scalar"
        else:
            reason = "indivisible" if p.shape[0] % n else None
        if reason:
            out.append(Refusal(path=p.path, unit=unit_of(p.path, units), shape=p.shape, dtype=p.dtype,
                               reason=reason, num_shards=n))
    return out


def plan_fully_shard(spec: ModelSpec, num_shards: int, *, units: list[str] | None = None,
                     compute_dtype: object = None, num_microbatches: int = 1,
                     calls_per_step: dict[str, int] | None = None) -> FullyShardPlan:
    """The units ``fully_shard`` would make of ``spec`` over ``num_shards`` ranks, and their collectives.

    Args:
        spec: The model's parameters.
        num_shards: N, the group size.
        units: Module paths to wrap (nested allowed: inner ones are wrapped first). Default: every
            transformer block (:func:`propose_units`). The root is always the last unit, for the
            parameters no other unit holds (it has none when the units cover everything).
        compute_dtype: ``fully_shard``'s ``compute_dtype``: gathered weights (and so the gradients
            reduce-scattered) are in this dtype. Default: as stored.
        num_microbatches: Forward/backward passes per optimizer step (each gathers and reduce-scatters again).
        calls_per_step: Calls of a unit per forward (default 1; e.g. a unit called twice gathers twice).

    Raises:
        ValueError: naming the unit (not a module, a parameter, repeated) or the knob.
    """
    n = integer("num_shards", num_shards, low=1)
    g = integer("num_microbatches", num_microbatches, low=1)
    compute = None if compute_dtype is None else canonical_dtype(compute_dtype)
    names = propose_units(spec) if units is None else _check_units(spec, list(units))
    calls = dict(calls_per_step or {})
    for name, c in calls.items():
        if name not in names and name != ROOT:
            raise ValueError(f"calls_per_step: {name!r} is not a unit; units: {names + [ROOT]}.")
        integer(f"calls_per_step[{name!r}]", c, low=1)
    members: dict[str, list] = {name: [] for name in names + [ROOT]}
    for p in spec:
        members[unit_of(p.path, names)].append(p)
    out = []
    for name, params in members.items():
        if not params:
            continue  # fully_shard returns a module with nothing to shard unchanged
        num = sum(p.size for p in params)
        dtype = _gathered_dtype([p.dtype for p in params], compute)
        k = calls.get(name, 1) * g if n > 1 else 0  # one rank: fully_shard returns the module unchanged
        out.append(Unit(name=name, paths=tuple(p.path for p in params), num_params=num,
                        param_bytes=sum(p.nbytes for p in params), gathered_dtype=dtype,
                        gathered_bytes=num * DTYPE_BYTES[dtype], num_all_gathers=k, num_reduce_scatters=k))
    if not out:
        raise ValueError(f"Model {spec.name!r} has no parameters to shard.")
    return FullyShardPlan(num_shards=n, compute_dtype=compute, units=tuple(out),
                          refusals=tuple(check_fully_shard(spec, n, names)))

"""The knobs of the memory model: one validated, keyword-only dataclass (torchtitan-style).

:class:`MemoryKnobs` checks every knob that needs no model in ``__post_init__``, so a bad value fails
where it is written, with a message naming the knob; :func:`workbench.estimate.memory.estimate_memory`
resolves the rest (a default ``param_dtype`` from the spec, the expert parameters) against the model.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Mapping

from workbench.core.buckets import BucketPlan
from workbench.core.checks import integer
from workbench.core.shards import ShardPlan
from workbench.core.specs import DTYPE_BYTES, canonical_dtype
from workbench.strategies import NAMES, Strategy, get_strategy, strategies

STRATEGIES = NAMES  # every registered strategy can be estimated (workbench.strategies)
#: Optimizer states kept per parameter (SGD none, momentum one buffer, Adam/AdamW m and v).
OPTIMIZER_NUM_STATES = {"sgd": 0, "sgd_momentum": 1, "adam": 2, "adamw": 2}
#: What a step copies instead of updating in place (``update_copies``).
UPDATE_COPIES = ("none", "parameters", "parameters_and_state")
#: What a ZeRO-3 unit's backward holds beside the states (``unit_buffers``; see estimate_memory).
UNIT_BUFFERS = ("parameters_and_gradients", "mlx", "sum_scatter_ring")


def count_knob(knob: str, value: object, minimum: int = 0) -> int:
    """``value`` as an int >= ``minimum``, a magnitude by the one rule (:func:`workbench.core.checks.as_whole`):
    bytes and parameter counts may be written ``1e9``; counts of ranks or micro-batches use ``integer``."""
    return integer(knob, value, low=minimum, magnitude=True)


def dtype_bytes(knob: str, dtype: object) -> int:
    """Bytes per element of ``dtype``; a ValueError naming ``knob`` if the dtype is unknown."""
    try:
        return DTYPE_BYTES[canonical_dtype(dtype)]
    except ValueError as err:
        raise ValueError(f"{knob}: {err}") from None


def _choice(knob: str, value: object, choices) -> None:
    if value not in choices:
        raise ValueError(f"Unknown {knob} {value!r}; choose one of {', '.join(choices)}.")


@dataclass(frozen=True, kw_only=True)
class MemoryKnobs:
    """Everything :func:`~workbench.estimate.memory.estimate_memory` needs besides the model.

    Field meanings, units and defaults are documented on ``estimate_memory``'s Args. Dtypes may be
    given in any spelling :func:`~workbench.core.specs.canonical_dtype` accepts; ``param_dtype=None``
    means the spec's single dtype (``bfloat16`` for a bare parameter count).
    """

    strategy: str = "fsdp"
    num_shards: int = 1
    num_replicas: int = 1
    world_size: int | None = None
    param_dtype: object = None
    grad_dtype: object = None
    master_dtype: object = "float32"
    optimizer: str = "adamw"
    optimizer_state_dtype: object = "float32"
    grad_accum_dtype: object = None
    bucket_plan: BucketPlan | None = None
    shard_plan: ShardPlan | None = None
    reshard_after_forward: bool = True
    units: Mapping[object, int] | None = None
    activation_bytes: int = 0
    update_copies: str = "none"
    num_microbatches: int = 1
    defer_sync: bool = True
    expert_parallel: int | None = None
    unit_buffers: str = "parameters_and_gradients"

    def __post_init__(self) -> None:
        get_strategy(self.strategy)  # an unknown name lists the registered ones
        _choice("optimizer", self.optimizer, OPTIMIZER_NUM_STATES)
        _choice("update_copies", self.update_copies, UPDATE_COPIES)
        _choice("unit_buffers", self.unit_buffers, UNIT_BUFFERS)
        n, r = integer("num_shards", self.num_shards, low=1), integer("num_replicas", self.num_replicas, low=1)
        if not self.record.replicas and r != 1:
            raise ValueError(f"num_replicas={r} applies to a replicated strategy "
                             f"({', '.join(s.name for s in strategies() if s.replicas)}) only; got strategy "
                             f"{self.strategy!r}.")
        if self.world_size is not None and integer("world_size", self.world_size, low=1) != n * r:
            raise ValueError(f"num_shards ({n}) * num_replicas ({r}) = {n * r} must equal world_size "
                             f"({self.world_size}).")
        count_knob("activation_bytes", self.activation_bytes)
        integer("num_microbatches", self.num_microbatches, low=1)
        for name in ("defer_sync", "reshard_after_forward"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}.")
        if self.expert_parallel is not None:
            integer("expert_parallel", self.expert_parallel, low=1)
        for name in ("param_dtype", "grad_dtype", "master_dtype", "grad_accum_dtype"):
            if getattr(self, name) is not None:
                dtype_bytes(name, getattr(self, name))
        dtype_bytes("optimizer_state_dtype", self.optimizer_state_dtype)
        if self.shard_plan is not None and self.shard_plan.num_shards != n:
            raise ValueError(f"shard_plan is for num_shards={self.shard_plan.num_shards}, but num_shards={n}.")
        for name, value in (self.units or {}).items():
            count_knob(f"units[{name!r}]", value)

    @classmethod
    def from_kwargs(cls, **knobs) -> "MemoryKnobs":
        """As the constructor, but an unknown knob is a ValueError that names it and lists the knobs."""
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(knobs) - set(names))
        if unknown:
            raise ValueError(f"Unknown memory knob(s) {', '.join(unknown)}; knobs: {', '.join(names)}.")
        return cls(**knobs)

    @property
    def record(self) -> Strategy:
        """The registered :class:`~workbench.strategies.Strategy` named by :attr:`strategy`."""
        return get_strategy(self.strategy)

    @property
    def sharded(self) -> tuple[bool, bool, bool]:
        """(parameters, gradients, optimizer side) sharded under :attr:`strategy`."""
        return tuple(self.record.sharded)

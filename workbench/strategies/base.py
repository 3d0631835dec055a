"""A sharding strategy is a record: what it shards, how it plans, which collectives a step issues.

One frozen :class:`Strategy` per strategy, defined in its family's module (:mod:`.ddp`, :mod:`.zero`,
:mod:`.zero3`, :mod:`.fully_shard`) and registered here by name. Every layer above asks the record,
never the name: the memory model reads :attr:`Strategy.sharded`, the communication model and the
accumulation study call :meth:`Strategy.step_collectives`, a run's spec checks
:meth:`Strategy.implementation`, and the rank programs build the step its :class:`Implementation`
names. Pure: standard library and NumPy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from workbench.core.buckets import plan_buckets
from workbench.core.fully_shard_plan import check_fully_shard
from workbench.core.shards import plan_shards
from workbench.core.specs import ModelSpec
from workbench.strategies.collectives import COLLECTIVE_KINDS, bus_factor, count_of_ranks

#: Strategy families: all-reduce everything (``data_parallel``); shard the optimizer side and sync by
#: reduce-scatter, gathering parameters after the update (``zero_1_2``: MLX's FSDP step too); shard
#: everything and gather each unit for its forward (``zero_3``, HSDP); MLX's own ``fully_shard``.
FAMILIES = ("data_parallel", "zero_1_2", "zero_3", "fully_shard")
#: Shard layouts of a bucket over N ranks (:func:`workbench.core.shards.plan_shards`).
LAYOUTS = ("row", "flat")
#: The global-norm all-reduce an implementation issues: always, only when ``max_norm`` is set, never.
NORM_POLICIES = ("always", "max_norm", "never")
#: What a step writes beside the arrays it updates, or keeps beside them for the run (``update_copies`` of
#: :class:`Implementation` and of :func:`workbench.estimate.memory.estimate_memory`, which says what each holds).
UPDATE_COPIES = ("none", "parameters", "parameters_and_state", "parameters_and_master_shard")


@dataclass(frozen=True)
class Sharded:
    """Which states are split over the N ranks of a shard group (the rest are whole on every rank)."""

    parameters: bool
    gradients: bool
    optimizer: bool  # master weights, optimizer state and fp32 gradient accumulators

    def __iter__(self) -> Iterator[bool]:
        return iter((self.parameters, self.gradients, self.optimizer))


@dataclass(frozen=True, kw_only=True)
class Implementation:
    """How one framework runs a strategy: the step builder, and what its step issues beyond the record.

    Attributes:
        framework: ``"mlx"`` or ``"jax"``.
        builder: ``"module:attribute"`` of the adapter's step or trainer builder, imported by the ranks.
        sync_per: ``"bucket"`` (one sync collective per bucket of ``communication_size``), ``"array"``
            (one per parameter array: JAX's DDP) or ``"unit"`` (one per gathered unit).
        norm: When a run's step all-reduces the squared norm of its gradient shards (:data:`NORM_POLICIES`;
            MLX runs always ask for the norm, to record it).
        unit_buffers: What a resharded unit holds in backward, for the memory model
            (``"parameters_and_gradients"``; ``"mlx"``: MLX's gathered bucket and its rebuilt copies;
            ``"whole_model"``: JAX's ZeRO-3 as XLA schedules it, every unit gathered at once and nothing saved by
            recomputing; :data:`~workbench.estimate.knobs.UNIT_BUFFERS`).
        defers_sync: With G > 1 micro-batches, the step can sync once, after the last (False: every
            micro-batch's backward syncs, as ``fully_shard``'s custom VJP does).
        update_copies: What the step writes beside the arrays it updates, or keeps beside them for the run
            (:data:`UPDATE_COPIES`, for the memory model): ``"parameters"``, MLX's functional update (a new
            parameter tree beside the old; the optimizer state reuses its buffers); ``"parameters_and_state"``,
            a jitted JAX step without donation (new parameters and new optimizer state); ``"none"``, a step
            whose buffers are donated (JAX's resident FSDP step, issue 30); ``"parameters_and_master_shard"``,
            MLX's resident FSDP step (a new parameter tree, and each bucket's master shard kept for the run).
        collective_scratch: Bytes its reduce-scatter's library holds beside the step, per input byte (the memory
            model's :attr:`~workbench.estimate.knobs.MemoryKnobs.collective_scratch`; 1.5 for XLA's on CPU).
        reuses_gathers: Its compiled step gathers each unit once a step, backward and every micro-batch reusing it
            (XLA: 8 all-gathers asked of the built-in LM's 4 units, 4 compiled; ``tests/test_jax_accum.py``). XLA also
            compiles a step's all-reduces into one op, but its CPU all-reduce still runs one collective per operand
            (JAX's DDP of the built-in LM on 4 ranks: 100-150 ms a step, its 20 arrays x 6 ring steps x 0.83 ms), so
            those are priced as asked.
    """

    framework: str
    builder: str
    sync_per: str = "bucket"
    norm: str = "never"
    unit_buffers: str = "parameters_and_gradients"
    defers_sync: bool = True
    update_copies: str = "parameters"
    collective_scratch: float = 0.0
    reuses_gathers: bool = False

    def __post_init__(self) -> None:
        if self.norm not in NORM_POLICIES or self.sync_per not in ("bucket", "array", "unit"):
            raise ValueError(f"Implementation {self.framework}:{self.builder}: norm={self.norm!r} or "
                             f"sync_per={self.sync_per!r} is not one of {NORM_POLICIES} / bucket, array, unit.")
        if self.update_copies not in UPDATE_COPIES:
            raise ValueError(f"Implementation {self.framework}:{self.builder}: update_copies={self.update_copies!r} "
                             f"is not one of {', '.join(UPDATE_COPIES)}.")

    def reduces_norm(self, max_norm_set: bool) -> bool:
        """Whether the step all-reduces the gradient norm (once per step)."""
        return self.norm == "always" or (self.norm == "max_norm" and max_norm_set)


@dataclass(frozen=True)
class Collective:
    """``count`` collectives of one ``kind`` per step, moving ``data_bytes`` (V, summed) over ``group_size`` ranks."""

    kind: str
    count: int
    data_bytes: float
    group_size: int

    @property
    def rank_bytes(self) -> float:
        """Bytes each rank sends on a ring (:func:`~workbench.strategies.collectives.bus_factor`)."""
        return bus_factor(self.kind, self.group_size) * self.data_bytes if self.group_size > 1 else 0.0


@dataclass(frozen=True, kw_only=True)
class StepShape:
    """What one optimizer step's collectives depend on besides the strategy.

    Attributes:
        num_ranks: N, the shard group (DDP: all ranks).
        sync_bytes: Bytes of each gradient-sync collective of one sync, in issue order: the buckets
            (padded to N where sharded), the arrays, or the units.
        units: ``zero3`` / ``fully_shard``: each gathered unit's bytes and whether backward gathers it
            again (freed after forward). None uses ``sync_bytes``, regathered per the record's
            ``reshard_after_forward``.
        num_microbatches: G.
        defer_sync: Sync once per step (True) or after every micro-batch.
        reduces_norm: The step all-reduces the gradient norm (a scalar; its bytes are left out).
        num_replicas: HSDP's replica groups (R), which all-reduce each shard.
    """

    num_ranks: int
    sync_bytes: tuple[float, ...]
    units: tuple[tuple[float, bool], ...] | None = None
    num_microbatches: int = 1
    defer_sync: bool = True
    reduces_norm: bool = False
    num_replicas: int = 1

    @property
    def syncs(self) -> int:
        """Gradient syncs per step: G when every micro-batch syncs, else 1."""
        return 1 if self.defer_sync or self.num_microbatches == 1 else self.num_microbatches


@dataclass(frozen=True, kw_only=True)
class Strategy:
    """One sharding strategy, as data.

    Attributes:
        name: The registry key (``RunSpec.strategy``, ``estimate_memory(strategy=...)``).
        family: One of :data:`FAMILIES`.
        summary: One line for a reader.
        sharded: The states split over the shard group.
        layout: How a bucket is cut into N shards (``"row"``, ``"flat"``), or None (nothing is cut, or the
            model is the same in either layout).
        units: What a gather or sync moves: ``"buckets"`` of ``communication_size`` or ``"modules"``
            (transformer blocks and the root, or the modules a user names).
        reshard_after_forward: ZeRO-3: gathered parameters are freed after forward and gathered again in
            backward (False keeps them to backward: more memory, fewer gathers).
        replicas: Shards within a group and replicates across groups (HSDP).
        greedy: May assign whole arrays to ranks (a greedy shard plan: all-reduce, then broadcast).
        splits_axis0: Each parameter is split along its axis 0, which N must divide (``fully_shard``'s rule);
            else the buckets are cut in :attr:`layout` (:func:`workbench.core.shards.plan_shards`).
        implementations: The frameworks that run it; none for a strategy only modelled.
    """

    name: str
    family: str
    summary: str
    sharded: Sharded
    layout: str | None = None
    units: str = "buckets"
    reshard_after_forward: bool = True
    replicas: bool = False
    greedy: bool = False
    splits_axis0: bool = False
    implementations: tuple[Implementation, ...] = ()

    def __post_init__(self) -> None:
        if self.family not in FAMILIES or (self.layout is not None and self.layout not in LAYOUTS):
            raise ValueError(f"Strategy {self.name!r}: family {self.family!r} / layout {self.layout!r} is not one of "
                             f"{FAMILIES} / {LAYOUTS}.")

    @property
    def sync_kind(self) -> str:
        """The collective that syncs gradients: ``all_reduce`` (DDP) or ``reduce_scatter``."""
        return "all_reduce" if self.family == "data_parallel" else "reduce_scatter"

    @property
    def gathers_units(self) -> bool:
        """Parameters are sharded, so each unit is gathered before its forward."""
        return self.sharded.parameters

    @property
    def frameworks(self) -> tuple[str, ...]:
        return tuple(i.framework for i in self.implementations)

    def implementation(self, framework: str) -> Implementation:
        """This strategy's implementation in ``framework``; a ValueError naming both if there is none."""
        impl = self.implementation_in(framework)
        if impl is not None:
            return impl
        runs = [s.name for s in strategies() if framework in s.frameworks]
        raise ValueError(f"strategy {self.name!r} has no {framework!r} implementation (it runs in: "
                         f"{', '.join(self.frameworks) or 'none, it is modelled only'}); {framework} runs: "
                         f"{', '.join(runs)}.")

    def implementation_in(self, framework: str) -> Implementation | None:
        """This strategy's implementation in ``framework``, or None where ``framework`` only models it."""
        return next((impl for impl in self.implementations if impl.framework == framework), None)

    def update_copies(self, framework: str) -> str:
        """What ``framework``'s step writes beside the arrays it updates, or keeps for the run (the memory model's
        ``update_copies``): its implementation's; for a strategy ``framework`` only models, its DDP step's."""
        impl = self if framework in self.frameworks else get_strategy("ddp")
        return impl.implementation(framework).update_copies

    def check_model(self, spec: ModelSpec, num_ranks: int, communication_size: int) -> None:
        """Raise a ValueError naming what of ``spec`` this strategy cannot split over ``num_ranks`` (nothing for
        a strategy that keeps parameters and optimizer state whole)."""
        if self.splits_axis0:
            refused = check_fully_shard(spec, num_ranks)
            if refused:
                more = f" And {len(refused) - 4} more (workbench.core.fully_shard_plan.check_fully_shard lists all)."
                raise ValueError(f"fully_shard over num_ranks={num_ranks} would refuse {len(refused)} parameter(s) "
                                 "of the model: " + " ".join(r.message for r in refused[:4])
                                 + (more if len(refused) > 4 else ""))
        elif self.layout is not None:
            plan_shards(plan_buckets(spec, communication_size), num_ranks, self.layout)

    def step_collectives(self, shape: StepShape) -> tuple[Collective, ...]:
        """The collectives one rank joins in one optimizer step, in issue order, by kind.

        DDP all-reduces every sync collective S times (S syncs: G when every micro-batch syncs, else 1).
        ZeRO-1/2 and MLX's FSDP reduce-scatter them S times and all-gather each once, after the update.
        ZeRO-3 and ``fully_shard`` gather every unit before its forward and reduce-scatter it in
        backward, S times, gathering again in backward each unit freed after forward; deferred, the units
        stay gathered for the whole loop, so once. HSDP all-reduces each shard across its R replicas.
        """
        n, s = count_of_ranks("num_ranks", shape.num_ranks), shape.syncs
        if n == 1:
            return ()
        total, b = float(sum(shape.sync_bytes)), len(shape.sync_bytes)
        rows = [Collective("all_reduce", 1, 0.0, n)] if shape.reduces_norm else []
        if self.family == "data_parallel":
            return (*rows, Collective("all_reduce", s * b, s * total, n))
        replicated = self.replicas and shape.num_replicas > 1
        if self.family == "zero_1_2":  # HSDP: each reduced shard all-reduced across the replicas too
            across = [Collective("all_reduce", s * b, s * total / n, shape.num_replicas)] if replicated else []
            return (*rows, Collective("reduce_scatter", s * b, s * total, n), *across, Collective("all_gather", b, total, n))
        units = shape.units if shape.units is not None else \
            tuple((x, self.reshard_after_forward) for x in shape.sync_bytes)
        u, unit_total = len(units), float(sum(x for x, _ in units))
        again = [x for x, regathered in units if regathered]
        once = shape.defer_sync and shape.num_microbatches > 1
        gathers = (u, unit_total) if once else (s * (u + len(again)), s * (unit_total + sum(again)))
        rows += [Collective("all_gather", gathers[0], gathers[1], n), Collective("reduce_scatter", s * u, s * unit_total, n)]
        if replicated:
            rows.append(Collective("all_reduce", s * u, s * unit_total / n, shape.num_replicas))
        return tuple(rows)

    def compiled_collectives(self, shape: StepShape, framework: str) -> tuple[Collective, ...]:
        """:meth:`step_collectives` as ``framework``'s compiled step runs them (what its time is): each unit gathered
        once a step where :attr:`Implementation.reuses_gathers`."""
        impl, out = self.implementation_in(framework), self.step_collectives(shape)
        if impl is not None and impl.reuses_gathers and shape.units:  # a strategy only modelled: as asked
            out = tuple(Collective("all_gather", len(shape.units), float(sum(b for b, _ in shape.units)), c.group_size)
                        if c.kind == "all_gather" else c for c in out)
        return out

    def collective_counts(self, shape: StepShape) -> dict[str, int]:
        """Collectives per step by kind (every kind of :data:`COLLECTIVE_KINDS`, zeros included)."""
        out = dict.fromkeys(COLLECTIVE_KINDS, 0)
        for c in self.step_collectives(shape):
            out[c.kind] += c.count
        return out

    def bytes_sent(self, shape: StepShape) -> int:
        """Bytes one rank sends per step on a ring (the norm's scalar left out)."""
        return int(round(sum(c.rank_bytes for c in self.step_collectives(shape))))


_REGISTRY: dict[str, Strategy] = {}


def register(strategy: Strategy) -> Strategy:
    """Add ``strategy`` to the registry (a second record under one name is a ValueError)."""
    if strategy.name in _REGISTRY:
        raise ValueError(f"strategy {strategy.name!r} is registered twice.")
    _REGISTRY[strategy.name] = strategy
    return strategy


def strategies(framework: str | None = None) -> tuple[Strategy, ...]:
    """Every registered strategy, in registration order; with ``framework``, only those it runs."""
    return tuple(s for s in _REGISTRY.values() if framework is None or framework in s.frameworks)


def get_strategy(name: object, *, framework: str | None = None) -> Strategy:
    """The record registered as ``name``; with ``framework``, one that framework runs.

    Raises:
        ValueError: naming ``name`` and listing the registered strategies (those ``framework`` runs).
    """
    strategy = _REGISTRY.get(name) if isinstance(name, str) else None
    if strategy is None:
        known = [s.name for s in strategies(framework)]
        where = f" that {framework} runs" if framework else ""
        raise ValueError(f"Unknown strategy {name!r}; the registered strategies{where}: {', '.join(known)}.")
    if framework is not None:
        strategy.implementation(framework)
    return strategy

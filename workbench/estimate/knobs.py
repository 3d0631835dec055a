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
from workbench.strategies import NAMES, UPDATE_COPIES, Strategy, get_strategy, strategies

STRATEGIES = NAMES  # every registered strategy can be estimated (workbench.strategies)
#: Optimizer states kept per parameter (SGD none, momentum one buffer, Adam/AdamW m and v).
OPTIMIZER_NUM_STATES = {"sgd": 0, "sgd_momentum": 1, "adam": 2, "adamw": 2}
#: What a ZeRO-3 unit's backward holds beside the states (``unit_buffers``; see estimate_memory).
UNIT_BUFFERS = ("parameters_and_gradients", "mlx", "sum_scatter_ring", "whole_model")


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

    Dtypes may be given in any spelling :func:`~workbench.core.specs.canonical_dtype` accepts.

    Attributes:
        strategy: A registered strategy (:func:`workbench.strategies.get_strategy`): what it shards.
        num_shards: N, the data-parallel degree (the shard degree of a replicated strategy: ``hsdp``).
        num_replicas: R, the replica groups of a replicated strategy (``hsdp``); 1 otherwise.
        world_size: If given, must equal ``num_shards * num_replicas``.
        param_dtype: The parameters' dtype. Default: the spec's single dtype, ``bfloat16`` for a count.
        grad_dtype: The gradients' dtype. Default: ``param_dtype``.
        master_dtype: The optimizer's master copy; none if ``None`` or equal to ``param_dtype``. Default float32.
        optimizer: A key of :data:`OPTIMIZER_NUM_STATES` (default ``adamw``).
        optimizer_state_dtype: The dtype of the optimizer's states (default float32).
        grad_accum_dtype: An extra gradient copy (fp32 accumulation; DeepSpeed's fp32 gradient
            partition), sharded like the optimizer state; ``None``: none.
        bucket_plan: Buffers from its largest bucket B (elements): DDP holds the concatenated bucket
            (B; its all-reduced copy is the ``reduced_gradients`` row); reduce-scatter B and its B/N
            result; all-gather B/N and B. Under ZeRO-3 the buckets are the units and these buffers
            are the gathered unit.
        shard_plan: Its worst rank's padding elements, times the bytes of every sharded state.
        sync_in_place: DDP: the gradients are all-reduced array by array in place (JAX's jitted DDP step: one
            ``psum`` per array, whose result XLA writes over the dead gradient), so there is neither an averaged
            copy beside them (``reduced_gradients``) nor a concatenated bucket (``all_reduce_buffer``).
            Measured on the validation LM at 2 ranks: XLA's plan 84.8 MiB, the rank's VmHWM 86.7 MiB; 91.3 MiB
            predicted in place, 105.8 MiB with both buffers. Default False (MLX's ``average_gradients``).
        reshard_after_forward: ZeRO-3/HSDP: True holds one gathered unit (its parameters, and its
            full gradient before the reduce-scatter: DeepSpeed's 4 B x largest layer in 16 bit);
            False keeps all gathered parameters until backward. FSDP2's prefetch adds one unit more.
        units: ZeRO-3 units ``{name: num_params}``; default: the buckets, else the spec's blocks
            (:func:`largest_unit_params`), else none.
        activation_bytes: Per rank and per micro-batch (the loop holds one micro-batch's at a time),
            e.g. from :func:`estimate_activation_bytes` with the micro-batch's size. The caller's to
            choose: deferred sync under ZeRO-3 runs the gathered model without recomputation, so pass
            the activations of ``reshard_after_forward=False`` there.
        update_copies: What the step writes beside the old arrays instead of in place.
            ``"none"``: nothing (the ZeRO paper; PyTorch's in-place DDP/FSDP). ``"parameters"``:
            a functional update as MLX's (the step returns a new parameter tree while the caller
            holds the old: the full tree, or the shard under ZeRO-3; DDP's averaged gradients are a
            second tree too; FSDP releases its gradient shards bucket by bucket as the new tree
            fills, so they add nothing at the peak; optimizer state reuses its buffers).
            ``"parameters_and_state"``: also new optimizer state and master weights (a jitted JAX
            step without ``donate_argnums``). ``"parameters_and_master_shard"``: ``"parameters"``, and a
            master copy of this rank's shard of the parameters kept for the run (the ``master_weights``
            row, in ``param_dtype`` where ``master_dtype`` gives none, with its padding; none at N = 1, where
            the parameters are views of the shard): MLX's resident FSDP step (:class:`~workbench.adapters.mlx.resident.ResidentFsdp`, issue 30). A run takes its
            implementation's (:attr:`workbench.strategies.Implementation.update_copies`).
        num_microbatches: G, micro-batches per optimizer step. With G > 1 the ``gradient_accumulator``
            row (``backward`` phase) holds the earlier micro-batches' summed gradient, in ``grad_dtype``,
            beside the current one's (the ``gradients`` row), as the MLX trainers of
            :mod:`workbench.adapters.mlx.accum` do; in the step the accumulator is the gradient the
            update applies (the ``gradients`` row), so it is not counted there. DDP: full, in both modes.
            Default 1: no accumulator, every row as without accumulation.
        defer_sync: With G > 1: accumulate local gradients and synchronise once, after the final
            micro-batch (True: the accumulator is unsharded; under ZeRO-3/HSDP every unit's parameters
            stay gathered for the whole loop and the gathered model's full micro-batch gradient is held,
            so ``gathered_unit`` is all parameters + the full gradient beyond the ``gradients`` row's
            1/N, whatever ``reshard_after_forward``), or reduce-scatter every micro-batch (False: this
            rank's 1/N of the accumulator; the other rows as at G = 1).
        expert_parallel: ``None``: routed experts are sharded by FSDP like every other parameter.
            An integer k >= 1: experts are outside the FSDP group, sharded by expert parallelism: expert
            parameters (:func:`~workbench.core.presets.is_expert_param`) and their gradients, optimizer
            state, update copies and accumulator are divided over k expert-parallel ranks (k = 1:
            replicated on every rank) whatever the strategy; non-expert parameters as before. Needs a
            :class:`ModelSpec` with expert parameters; the default ZeRO-3 unit then counts only
            non-expert parameters, and ``bucket_plan``, ``shard_plan`` and ``units`` are taken as given
            (plan them for the FSDP-sharded, non-expert parameters).
        unit_buffers: ZeRO-3/HSDP with ``reshard_after_forward`` (and no deferred sync): what the
            backward of the largest unit (U elements) holds beside the states.
            ``"parameters_and_gradients"``: ``U * (pb + gb)``, its gathered parameters and full gradient
            (DeepSpeed's 4 B x largest layer in 16 bit). ``"mlx"``: the buffers of
            :class:`~workbench.adapters.mlx.zero3.ShardedUnit`'s backward, which gathers again and
            recomputes: the all-gathered bucket and the per-array copies ``rebuild_arrays`` cuts from it
            (``2 U pb``; ``U pb`` on one rank, whose arrays are views of its copy), the unit's full gradient
            (``U gb``), and the reduce-scatter's buffers: ``2 U gb`` on one rank (the rows concatenated, their
            scaled copy), ``3 U gb`` at 2 ranks (both rows, the all-gathered pair, their sum and its scaled copy),
            else ``U gb (1 + 2 / N)``: what a step holds at its peak (the one-rank figure measured alone, held
            with the others on 2 and 4 ranks' steps: :func:`~workbench.estimate.memory.unit_reduce_scatter_bytes`).
            ``"sum_scatter_ring"``
            (without resharding: MLX's ``fully_shard`` on ring or MPI, ``sum_scatter`` supplied by the workbench's
            ring reduce-scatter): beside every gathered unit and the largest unit's gradient, the reduce-scatter's
            buffers: ``U gb (1 + 1/N)`` at 2 ranks (the exchange's two rows and the sum), ``2 U gb / N`` above (the
            ring's chunks in flight). Measured: ``tests/test_fully_shard_runs.py``. ``"whole_model"`` (JAX's
            ZeRO-3 step as XLA compiles it): every unit gathered at once and kept through backward, with the
            full gradient before its reduce-scatter, ``psi * (pb + gb)``; XLA's schedule issues the units'
            all-gathers together, so the step's peak is the whole model's, as a model of one unit (XLA's
            ``memory_analysis`` and the rank's VmHWM: :func:`~workbench.runs.estimate.estimate_run_memory`).
        collective_scratch: ZeRO-3/HSDP: bytes the collective library holds outside the step's own buffers while
            a unit's gradient is reduce-scattered in backward, per byte of the largest reduce-scatter's input (the
            largest bucket's gradient; the ``collective_scratch`` row). 0: none (MLX, NCCL). 1.5: XLA's CPU
            reduce-scatter over gloo (``GlooCommunicator::ReduceScatter`` copies its whole input into a buffer of
            its own, and gloo's ``ReduceScatterHalvingDoubling`` receives into a buffer of half the input; at a
            power-of-two N). On the validation LM at 2 ranks VmHWM rose 19.6-20.6 MiB above XLA's plan of the
            step, for a 13.0 MiB bucket (notebook 06).
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
    sync_in_place: bool = False
    collective_scratch: float = 0.0

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
        for name in ("defer_sync", "reshard_after_forward", "sync_in_place"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}.")
        if self.expert_parallel is not None:
            integer("expert_parallel", self.expert_parallel, low=1)
        if isinstance(self.collective_scratch, bool) or not isinstance(self.collective_scratch, (int, float)) or \
                not 0 <= self.collective_scratch < float("inf"):
            raise ValueError(f"collective_scratch must be a number of bytes per input byte, 0 or more; "
                             f"got {self.collective_scratch!r}.")
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

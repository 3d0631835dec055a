"""Memory per rank of one data-parallel training step, component by component.

Model states follow the ZeRO paper (Rajbhandari et al. 2019, arXiv:1910.02054, Sec. 3 and 5):
with Psi parameters, N ranks and K optimizer bytes per parameter, DDP holds (2 + 2 + K) Psi,
ZeRO-1 (P_os) 4 Psi + K Psi / N, ZeRO-2 (P_os+g) 2 Psi + (2 + K) Psi / N, ZeRO-3 (P_os+g+p)
(2 + 2 + K) Psi / N. Here K is split into its parts (master weights, optimizer state, an fp32
gradient copy), and the transient terms most estimators omit get their own rows: collective
bucket buffers, flat-layout padding, the copies a functional update makes, the largest gathered
unit under ZeRO-3, activations.

Rows fall in three phases, and the peak is not their sum: ``states`` persist all step; the
``backward`` rows (activations, the gathered unit, the gradient accumulator) are gone before
the ``step`` rows (collective buffers, update copies) appear, so ``total_bytes = states +
max(backward, step)``. The phase split and the step rows were fitted to nothing: they follow
from what the MLX step holds (measured with ``mx.get_peak_memory`` around each phase;
:mod:`workbench.runs.estimate` checks them on every stored run).

Strategies: ``ddp``; ``zero1``; ``zero2``; ``fsdp`` (MLX's ``fsdp_apply_gradients``: full
parameters and gradients, sharded optimizer state, reduce-scatter / all-gather per bucket);
``zero3`` (everything sharded); ``hsdp`` (ZeRO-3 inside a shard group of ``num_shards``,
replicated over ``num_replicas`` groups, as PyTorch FSDP2's HSDP). Bytes are per rank.

Gradient accumulation (``num_microbatches`` G > 1) follows the MLX trainers of
:mod:`workbench.adapters.mlx.accum` (measured there: ``tests/test_mlx_zero3.py``). Deferred sync
(NeMo Automodel's ``prepare_for_grad_accumulation``) keeps an unsharded accumulator and, under
ZeRO-3, every unit gathered for the whole loop; syncing every micro-batch keeps this rank's 1/N.
Mixture-of-experts (``expert_parallel``): routed experts sharded by an expert-parallel group (each
rank holding whole experts) instead of the FSDP group, as NeMo Automodel's MoE parallelizer does.
Pure: standard library and NumPy only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from workbench.core.presets import is_expert_param
from workbench.core.specs import ModelSpec, canonical_dtype
from workbench.estimate.activations import largest_unit_params
from workbench.estimate.breakdown import MemoryComponent, MemoryEstimate
from workbench.estimate.knobs import OPTIMIZER_NUM_STATES, MemoryKnobs, count_knob, dtype_bytes


def estimate_memory(model: ModelSpec | int, strategy: str | MemoryKnobs = "fsdp", num_shards: int = 1,
                    **knobs) -> MemoryEstimate:
    """Estimate the bytes each rank holds at the peak of a training step.

    The knobs are the fields of :class:`~workbench.estimate.knobs.MemoryKnobs`: pass them as keywords
    (validated there), or pass one ``MemoryKnobs`` as ``strategy``.

    Args:
        model: A :class:`ModelSpec` or a parameter count (Psi).
        strategy: A registered strategy (:func:`workbench.strategies.get_strategy`), or a :class:`~workbench.estimate.knobs.MemoryKnobs`.
        num_shards: N, the data-parallel degree (the shard degree of a replicated strategy: ``hsdp``).
        **knobs: The other fields of :class:`~workbench.estimate.knobs.MemoryKnobs`, each documented there
            with its unit and default (dtypes, optimizer, plans, units, activations, micro-batches, experts).

    Raises:
        ValueError: on a negative size, ``num_shards < 1``, ``num_microbatches < 1``, a non-boolean
            ``defer_sync``, an unknown strategy, optimizer, dtype or ``unit_buffers``, an HSDP shape not multiplying to
            ``world_size``, a shard plan for another N, or ``expert_parallel`` below 1, with a bare
            parameter count or a spec without experts, or an unknown knob; the message names the knob.
    """
    if isinstance(strategy, MemoryKnobs):
        if knobs or num_shards != 1:
            raise ValueError("Pass either a MemoryKnobs or knobs as keywords, not both.")
        k = strategy
    else:
        k = MemoryKnobs.from_kwargs(strategy=strategy, num_shards=num_shards, **knobs)
    spec = model if isinstance(model, ModelSpec) else None
    psi = spec.num_params if spec is not None else count_knob("model (parameter count)", model)
    psi_e = _expert_params(spec, psi, k.expert_parallel)
    _check_plans_fit(k, spec, psi)
    b = _Bytes.of(k, spec)
    rows = _state_rows(k, b, psi, psi_e)
    rows.append(_padding_row(k, b))
    rows += _step_rows(k, b, psi, psi_e)
    rows.append(_unit_row(k, b, spec, psi - psi_e))
    rows.append(MemoryComponent("activations", k.activation_bytes, "given (see estimate_activation_bytes)"))
    g = k.num_microbatches
    # The accumulator is sharded only by a reduce-scatter every micro-batch; DDP all-reduces, so it is full.
    rows.append(_state(k, psi, psi_e, "gradient_accumulator", b.grad, k.record.family != "data_parallel" and not k.defer_sync,
                       f"gradients summed over the earlier of {g} micro-batches") if g > 1 else
                MemoryComponent("gradient_accumulator", 0, "none: one micro-batch per step"))
    rows.append(_scratch_row(k, b, psi - psi_e))
    return MemoryEstimate(strategy=k.strategy, num_params=psi, num_shards=k.num_shards, num_replicas=k.num_replicas,
                          components=tuple(rows))


#: The expert index in a routed expert's path (``...experts.<e>.``).
_EXPERT_INDEX = re.compile(r"(?:^|\.)experts\.(\d+)\.")


def _expert_params(spec: ModelSpec | None, psi: int, expert_parallel: int | None) -> int:
    """Routed-expert parameters held outside the FSDP group (0 without expert parallelism)."""
    if expert_parallel is None:
        return 0
    if spec is None:
        raise ValueError(f"expert_parallel={expert_parallel} needs a ModelSpec, to find the expert parameters by "
                         f"path (workbench.core.presets.is_expert_param); got a parameter count ({psi:,}).")
    psi_e = sum(p.size for p in spec if is_expert_param(p.path))
    if not psi_e:
        raise ValueError(f"expert_parallel={expert_parallel}: spec {spec.name!r} has no expert parameters (paths "
                         "with 'experts.<e>.'); use expert_parallel=None for a dense model.")
    num_experts = len({m.group(1) for p in spec if (m := _EXPERT_INDEX.search(p.path))})
    if num_experts % expert_parallel:
        raise ValueError(f"expert_parallel={expert_parallel} must divide the {num_experts} experts per block of "
                         f"{spec.name!r} (each expert-parallel rank holds whole experts).")
    return psi_e


def _check_plans_fit(k: MemoryKnobs, spec: ModelSpec | None, psi: int) -> None:
    """A bucket or shard plan must be of this model (the plans of another model give wrong buffers)."""
    plans = (("bucket_plan", k.bucket_plan), ("shard_plan", k.shard_plan.buckets if k.shard_plan else None))
    for knob, plan in plans:
        if plan is None or k.expert_parallel is not None:  # with experts outside FSDP, plans cover the rest
            continue
        if plan.spec.num_params != psi or (spec is not None and plan.spec.paths != spec.paths):
            raise ValueError(f"{knob} is of model {plan.spec.name!r} ({plan.spec.num_params:,} parameters), not of "
                             f"the model estimated ({psi:,} parameters); plan the buckets of this model.")


@dataclass(frozen=True)
class _Bytes:
    """Bytes per element of each state, resolved from the knobs and the spec."""

    param: int
    grad: int
    master: int
    optimizer: int
    accum: int

    @classmethod
    def of(cls, k: MemoryKnobs, spec: ModelSpec | None) -> "_Bytes":
        param_dtype = k.param_dtype
        if param_dtype is None:
            dtypes = {p.dtype for p in spec} if spec is not None else {"bfloat16"}
            if len(dtypes) != 1:
                raise ValueError(f"param_dtype must be given for a spec with mixed dtypes {sorted(dtypes)}.")
            param_dtype = dtypes.pop()
        pb = dtype_bytes("param_dtype", param_dtype)
        gb = dtype_bytes("grad_dtype", k.grad_dtype if k.grad_dtype is not None else param_dtype)
        mb = dtype_bytes("master_dtype", k.master_dtype) if k.master_dtype is not None else 0
        if mb and canonical_dtype(k.master_dtype) == canonical_dtype(param_dtype):
            mb = 0  # the parameters are the master copy
        if k.update_copies == "parameters_and_master_shard" and not mb and k.num_shards > 1:
            # A master copy of the shard kept for the run, in the parameters' dtype (MLX's resident FSDP); a group
            # of one gathers nothing, and its parameters are views of the shard (measured: test_resident_mlx_local).
            mb = pb
        ob = OPTIMIZER_NUM_STATES[k.optimizer] * dtype_bytes("optimizer_state_dtype", k.optimizer_state_dtype)
        ab = dtype_bytes("grad_accum_dtype", k.grad_accum_dtype) if k.grad_accum_dtype is not None else 0
        return cls(pb, gb, mb, ob, ab)


def _state(k: MemoryKnobs, psi: int, psi_e: int, name: str, nbytes: int, sharded: bool, what: str) -> MemoryComponent:
    """A state of ``nbytes`` per parameter, divided over N where ``sharded`` (experts over their own group)."""
    n = k.num_shards
    if k.expert_parallel is None:
        return MemoryComponent(name, -(-psi * nbytes // n) if sharded else psi * nbytes,
                               f"{nbytes} B x {psi:,} {what}" + (f" / {n}" if sharded else ""))
    psi_d, ep = psi - psi_e, k.expert_parallel
    dense = -(-psi_d * nbytes // n) if sharded else psi_d * nbytes
    return MemoryComponent(name, dense + -(-psi_e * nbytes // ep),
                           f"{nbytes} B x ({psi_d:,} non-expert" + (f" / {n}" if sharded else "")
                           + f" + {psi_e:,} expert / {ep}) {what}")


def _state_rows(k: MemoryKnobs, b: _Bytes, psi: int, psi_e: int) -> list[MemoryComponent]:
    sp, sg, so = k.sharded
    return [_state(k, psi, psi_e, "parameters", b.param, sp, "parameters"),
            _state(k, psi, psi_e, "gradients", b.grad, sg, "gradients"),
            _state(k, psi, psi_e, "master_weights", b.master, so, "master weights"),
            _state(k, psi, psi_e, "optimizer_state", b.optimizer, so, f"{k.optimizer} state"),
            _state(k, psi, psi_e, "fp32_gradients", b.accum, so, "accumulated gradients")]


def _padding_row(k: MemoryKnobs, b: _Bytes) -> MemoryComponent:
    pad = 0
    if k.shard_plan is not None:
        sp, sg, so = k.sharded
        pspec = k.shard_plan.buckets.spec
        pad_elems = -(-int(k.shard_plan.rank_padding_bytes.max()) * pspec.num_params // max(pspec.nbytes, 1))
        pad = pad_elems * (b.param * sp + b.grad * sg + (b.master + b.optimizer + b.accum) * so)
    return MemoryComponent("flat_padding", pad, "worst rank's padding elements x bytes of sharded states")


def _step_rows(k: MemoryKnobs, b: _Bytes, psi: int, psi_e: int) -> list[MemoryComponent]:
    """Update copies and collective buffers: what exists while gradients sync and the update runs."""
    sp, _, so = k.sharded
    copies = k.update_copies != "none"  # a new parameter tree beside the old
    state_copies = k.update_copies == "parameters_and_state"
    averaged_copy = copies and k.record.family == "data_parallel" and not k.sync_in_place
    rows = [
        _state(k, psi, psi_e, "reduced_gradients", b.grad if averaged_copy else 0, False,
               "averaged gradients beside the local ones"),
        _state(k, psi, psi_e, "updated_parameters", b.param if copies else 0, sp, "new parameters beside the old"),
        _state(k, psi, psi_e, "updated_optimizer_state", b.master + b.optimizer + b.accum if state_copies else 0, so,
               "new master weights and optimizer state beside the old"),
    ]
    ar = rs = ag = 0
    n, plan = k.num_shards, k.bucket_plan
    if plan is not None:
        big = int(plan.bucket_elems.max()) if plan.num_buckets else 0
        if k.record.family == "data_parallel":
            ar = 0 if k.sync_in_place else big * b.grad
        elif not sp:
            rs, ag = big * b.grad + -(-big * b.grad // n), big * b.param + -(-big * b.param // n)
    return rows + [MemoryComponent("all_reduce_buffer", ar, "largest bucket, concatenated (its all-reduced copy "
                                   "is reduced_gradients)"),
                   MemoryComponent("reduce_scatter_buffer", rs, "largest bucket of gradients + its 1/N result"),
                   MemoryComponent("all_gather_buffer", ag, "1/N input + largest bucket of parameters")]


def _unit_row(k: MemoryKnobs, b: _Bytes, spec: ModelSpec | None, psi_d: int) -> MemoryComponent:
    """ZeRO-3/HSDP: the gathered unit the backward holds beside the states (0 where parameters are whole)."""
    sp = k.sharded[0]
    pb, gb, n = b.param, b.grad, k.num_shards
    unit_what = "largest unit's parameters and gradients" if k.reshard_after_forward else \
        "all gathered parameters + largest unit's gradients"
    if not sp:
        return MemoryComponent("gathered_unit", 0, unit_what)
    if k.num_microbatches > 1 and k.defer_sync:  # the gathered model differentiated whole: its full gradient
        return MemoryComponent("gathered_unit", psi_d * pb + psi_d * gb - -(-psi_d * gb // n),
                               "deferred sync: all gathered parameters + the micro-batch's full gradient beyond "
                               "its 1/N")
    if k.unit_buffers == "whole_model":  # XLA gathers every unit at once: the model's peak, as one unit's
        return MemoryComponent("gathered_unit", psi_d * (pb + gb),
                               "every unit gathered at once (XLA's schedule) + the full gradient before its "
                               "reduce-scatter")
    if k.units is not None:
        largest = max(k.units.values(), default=0)
    elif k.bucket_plan is not None:
        largest = int(k.bucket_plan.bucket_elems.max()) if k.bucket_plan.num_buckets else 0
    else:
        largest = largest_unit_params(spec, experts=k.expert_parallel is None) if spec is not None else 0
    if not k.reshard_after_forward:
        if k.unit_buffers == "sum_scatter_ring":  # the workbench's ring reduce-scatter, supplied as sum_scatter
            # 2 ranks: the other rank's row is all-gathered (both rows, U gb) and summed into this rank's (U gb / 2);
            # more: the ring's two chunks in flight, sent and received (2 U gb / N).
            rs = largest * gb + -(-largest * gb // n) if n == 2 else 2 * -(-largest * gb // n) if n > 2 else 0
            return MemoryComponent("gathered_unit", psi_d * pb + largest * gb + rs,
                                   unit_what + " + the ring reduce-scatter's buffers of the largest unit's gradient "
                                   "(U gb (1 + 1/N) at 2 ranks, 2 U gb / N above)")
        return MemoryComponent("gathered_unit", psi_d * pb + largest * gb, unit_what)
    if k.unit_buffers == "mlx":  # gathered bucket + rebuild_arrays copies, full gradient, reduce-scatter buffers
        gather = (2 if n > 1 else 1) * largest * pb  # one rank: its copy of the rows, the arrays views of it
        rs = unit_reduce_scatter_bytes(largest * gb, n)
        return MemoryComponent("gathered_unit", gather + largest * gb + rs,
                               "largest unit (U): 2 U pb (all-gathered bucket + rebuild_arrays copies; U pb on one "
                               "rank) + U gb (full gradient) + the reduce-scatter's buffers: 2 U gb on one rank (the rows "
                               "concatenated, their scaled copy), 3 U gb at 2 ranks (both rows, the exchanged pair, "
                               "the sum, its scaled copy), U gb (1 + 2 / N) above")
    return MemoryComponent("gathered_unit", largest * (pb + gb), unit_what)


def unit_reduce_scatter_bytes(unit_grad_bytes: int, n: int) -> int:
    """What ``ShardedUnit.scatter`` holds at a step's peak while it reduce-scatters a unit's gradient of
    ``unit_grad_bytes`` (U) over ``n`` ranks with the workbench's ring, beside the full gradient.

    On a group of one: the rows concatenated and their scaled copy (2 U, measured alone; 1 U less than the 2-rank
    figure used before, so the activations derived from the profile's one-rank step came 1 U short). At 2
    ranks 3 U (both rows concatenated, the all-gathered pair, the sum and its scaled copy), above ``U (1 + 2 / N)``
    (the rows as exchanged, the received row and the sum). A reduce-scatter measured alone holds more (3.5 U at 2
    ranks, 2.75 U at 4: every received row and partial sum to the ring's end) but in a step MLX frees part of it before
    the peak: the 8-block LM of ``tests/test_mlx_zero3.py`` read 3.7 U of unit buffers in all at 4 ranks where the
    isolated figures sum to 5.75 U. Held on 2 and 4 ranks' fsdp-full steps of the built-in LM and the attention
    example (``benchmarks/bench_step_prediction.py``)."""
    if n <= 1:
        return 2 * unit_grad_bytes
    return 3 * unit_grad_bytes if n == 2 else unit_grad_bytes + 2 * -(-unit_grad_bytes // n)


def _scratch_row(k: MemoryKnobs, b: _Bytes, psi_d: int) -> MemoryComponent:
    """ZeRO-3/HSDP: the collective library's scratch while the largest input is reduce-scattered in backward."""
    what = "x the largest reduce-scatter's input: the collective library's scratch outside the step's buffers"
    if not k.collective_scratch or not k.sharded[0] or k.num_shards == 1:
        return MemoryComponent("collective_scratch", 0, "none: the collective library holds no scratch beside the step")
    largest = int(k.bucket_plan.bucket_elems.max()) if k.bucket_plan is not None and k.bucket_plan.num_buckets \
        else psi_d
    return MemoryComponent("collective_scratch", round(k.collective_scratch * largest * b.grad),
                           f"{k.collective_scratch:g} {what} ({largest:,} x {b.grad} B)")


def compare_strategies(model: ModelSpec | int, num_shards: int,
                       strategies: tuple[str, ...] = ("ddp", "zero1", "zero2", "fsdp", "zero3"),
                       **knobs) -> dict[str, MemoryEstimate]:
    """:func:`estimate_memory` for each strategy with the same knobs, by strategy name."""
    return {s: estimate_memory(model, s, num_shards, **knobs) for s in strategies}



"""Mixture-of-experts under FSDP: where the experts are sharded, and what deferred sync costs them.

Two knobs of :func:`workbench.estimate.memory.estimate_memory` describe an MoE model's experts:

* ``expert_parallel``: ``None`` shards the routed experts by the FSDP group like every other
  parameter; an EP degree k shards them by an expert-parallel group instead, each EP rank holding
  whole experts (NeMo Automodel's MoE parallelizer): per rank ``Psi_d / N + Psi_e / k`` of every
  model state under full sharding, instead of ``(Psi_d + Psi_e) / N``; k = 1 replicates them.
* ``num_microbatches`` / ``defer_sync``: what NeMo's ``MoEFSDPSyncMixin`` does during gradient
  accumulation. ``prepare_for_grad_accumulation`` (and, with pipeline parallelism,
  ``_disable_fsdp_for_moe_module``) turns off resharding after backward and gradient sync for every
  FSDP module it finds -- the model, the embeddings, the LM head and each block's separately
  wrapped ``mlp.experts`` -- so until ``prepare_for_final_backward`` the experts stay gathered and
  their gradients accumulate unsharded: the deferred mode, where the experts are most of the bytes.
  :func:`moe_accumulation_table` shows it.

Everything here is a view of :func:`workbench.estimate.memory.estimate_memory` with its
``expert_parallel`` knob (``None``: experts sharded by FSDP like every other parameter):
:func:`moe_memory_table` and :func:`moe_rank_layout` are pandas tables, :func:`moe_summary` a
few headline numbers, and the ``fig_*`` functions draw those tables in the figure style of
:mod:`workbench.views.plans` (returned, never shown). Sizes on axes are decimal GB.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from workbench.core.checks import integer
from workbench.core.param_kinds import param_kind
from workbench.core.specs import ModelSpec
from workbench.estimate.breakdown import MemoryEstimate
from workbench.estimate.memory import estimate_memory
from workbench.estimate.moe import (
    DEFAULT_EXPERT_PARALLEL,
    check_expert_parallel,
    expert_params,
    moe_preset,
    policy_label,
)
from workbench.strategies import get_strategy
from workbench.views.style import KIND_COLORS

if TYPE_CHECKING:
    import pandas as pd

GB = 10**9


def _estimate(spec: ModelSpec, strategy: str, num_shards: int, expert_parallel: int | None,
              knobs: dict) -> MemoryEstimate:
    return estimate_memory(spec, strategy, num_shards, expert_parallel=expert_parallel, **knobs)


def moe_memory_table(preset_name: str, num_shards: int,
                     expert_parallel_degrees: Sequence[int | None] = DEFAULT_EXPERT_PARALLEL, *,
                     strategy: str = "zero3", **knobs) -> "pd.DataFrame":
    """Per-rank bytes of an MoE preset with experts sharded by FSDP or taken out of it, one row per policy.

    Args:
        preset_name: An MoE key of :data:`~workbench.core.presets.PRESETS` (``"mixtral-8x7b"``,
            ``"qwen3-30b-a3b"``, ``"tiny-moe"``).
        num_shards: N, the FSDP degree.
        expert_parallel_degrees: Policies: ``None`` (experts sharded by FSDP) and EP degrees k
            (experts outside the FSDP group, sharded by k expert-parallel ranks: ``Psi_e / k`` per rank).
        strategy: Of :func:`~workbench.estimate.memory.estimate_memory`; default ``"zero3"`` (FSDP2's
            ``fully_shard``, which NeMo uses).
        **knobs: Passed to :func:`~workbench.estimate.memory.estimate_memory` (dtypes, optimizer, activations...).

    Returns:
        Columns ``preset``, ``strategy``, ``num_shards``, ``policy``, ``expert_parallel`` (None or
        k), ``num_params``, ``num_expert_params``, ``expert_share`` (of parameters),
        ``parameters_bytes``, ``gradients_bytes``, ``optimizer_state_bytes`` (optimizer state,
        master weights and fp32 gradients), ``model_state_bytes`` (their sum), ``total_bytes``
        (the estimate's peak: with the transients, e.g. ZeRO-3's gathered unit, which holds no
        experts once they are outside FSDP) and ``total_vs_first`` (``total_bytes`` over the first
        policy's).

    Raises:
        ValueError: on an unknown or dense preset, an EP degree that does not divide the experts
            per block, or a bad knob (named by :func:`~workbench.estimate.memory.estimate_memory`).
    """
    import pandas as pd

    spec, num_experts = moe_preset(preset_name)
    degrees = check_expert_parallel(expert_parallel_degrees, num_experts)
    num_expert = expert_params(spec)
    rows = []
    for k in degrees:
        est = _estimate(spec, strategy, num_shards, k, knobs)
        rows.append(dict(preset=preset_name, strategy=strategy, num_shards=est.num_shards, policy=policy_label(k),
                         expert_parallel=k, num_params=spec.num_params, num_expert_params=num_expert,
                         expert_share=num_expert / spec.num_params, parameters_bytes=est["parameters"],
                         gradients_bytes=est["gradients"],
                         optimizer_state_bytes=est["optimizer_state"] + est["master_weights"] + est["fp32_gradients"],
                         model_state_bytes=est.model_state_bytes, total_bytes=est.total_bytes))
    table = pd.DataFrame(rows)
    table["expert_parallel"] = pd.Series(list(degrees), dtype=object)  # None stays None, not NaN
    table["total_vs_first"] = table.total_bytes / table.total_bytes.iloc[0]
    return table


def moe_rank_layout(preset_name: str, num_shards: int, expert_parallel: int | None = 1, *,
                    strategy: str = "zero3", **knobs) -> "pd.DataFrame":
    """What one rank holds, by parameter kind (:func:`~workbench.core.param_kinds.param_kind`), under one policy.

    Every rank holds the same bytes (FSDP shards evenly; each EP rank holds the same number of
    experts), so this is any rank. Each kind's model states are
    :func:`~workbench.estimate.memory.estimate_memory` of the spec restricted to that kind, so the rows
    sum to the whole model's ``model_state_bytes`` up to rounding of each kind's 1/N.

    Args:
        preset_name, num_shards, strategy, **knobs: As :func:`moe_memory_table`.
        expert_parallel: One policy: ``None`` or an EP degree k.

    Returns:
        One row per kind present: ``kind``, ``held_as`` (``"fsdp"``: as the strategy shards it,
        ``"experts"``: whole experts outside FSDP), ``description``, ``num_params`` (of the
        model), ``params_per_rank`` (elements), ``parameters_bytes`` and ``model_state_bytes``
        per rank.

    Raises:
        ValueError: as :func:`moe_memory_table`.
    """
    import pandas as pd

    spec, num_experts = moe_preset(preset_name)
    (k,) = check_expert_parallel((expert_parallel,), num_experts)
    by_kind: dict[str, list] = {}
    for p in spec:
        by_kind.setdefault(param_kind(p.path), []).append(p)
    sharded_params = get_strategy(strategy).sharded.parameters  # an unknown name lists the registered ones
    rows = []
    for kind, params in sorted(by_kind.items(), key=lambda kv: list(KIND_COLORS).index(kv[0])):
        sub = ModelSpec(f"{spec.name}:{kind}", tuple(params))
        outside = k is not None and kind == "expert"
        est = _estimate(sub, strategy, num_shards, k if outside else None, knobs)
        if outside:
            held = "experts"
            text = ("every expert, replicated on every rank" if k == 1 else
                    f"{num_experts // k} whole experts of {num_experts} per block (EP={k})")
        else:
            held = "fsdp"
            text = f"1/{est.num_shards} FSDP shard" if sharded_params else \
                f"full parameters ({strategy}: not sharded)"
        elems = sub.num_params / k if outside else (sub.num_params / est.num_shards if sharded_params
                                                    else sub.num_params)
        rows.append(dict(kind=kind, held_as=held, description=text, num_params=sub.num_params,
                         params_per_rank=elems, parameters_bytes=est["parameters"],
                         model_state_bytes=est.model_state_bytes))
    return pd.DataFrame(rows)


@dataclass(frozen=True, kw_only=True)
class MoESummary:
    """Headline numbers of an MoE preset at one N (bytes per rank, peak of :func:`~workbench.estimate.memory.estimate_memory`).

    ``sharded_*``: experts sharded by FSDP; ``excluded_*``: experts outside FSDP at EP
    degree ``expert_parallel``; ``*_total_bytes`` the peak, ``*_model_state_bytes`` the ZeRO terms
    alone (equal at EP degree = N; the peaks differ there by the experts in ZeRO-3's gathered
    unit); ``expert_states_bytes``: the experts' model states per rank with FSDP disabled for them.
    """

    preset: str
    strategy: str
    num_shards: int
    expert_parallel: int
    num_params: int
    num_expert_params: int
    sharded_total_bytes: int
    excluded_total_bytes: int
    sharded_model_state_bytes: int
    excluded_model_state_bytes: int
    expert_states_bytes: int

    @property
    def expert_share(self) -> float:
        """Expert parameters over all parameters."""
        return self.num_expert_params / self.num_params

    @property
    def excluded_over_sharded(self) -> float:
        """How many times more a rank holds with experts outside FSDP."""
        return self.excluded_total_bytes / self.sharded_total_bytes


def moe_summary(preset_name: str = "mixtral-8x7b", num_shards: int = 8, expert_parallel: int = 1, *,
                strategy: str = "zero3", **knobs) -> MoESummary:
    """Expert share and per-rank bytes with experts sharded by FSDP vs excluded from it, at one N.

    Raises:
        ValueError: as :func:`moe_memory_table`; ``expert_parallel=None``.
    """
    if expert_parallel is None:
        raise ValueError("expert_parallel: give the EP degree k >= 1 to compare with FSDP-sharded experts.")
    table = moe_memory_table(preset_name, num_shards, (None, expert_parallel), strategy=strategy, **knobs)
    layout = moe_rank_layout(preset_name, num_shards, expert_parallel, strategy=strategy, **knobs)
    sharded, excluded = table.iloc[0], table.iloc[1]
    return MoESummary(preset=preset_name, strategy=strategy, num_shards=int(sharded.num_shards),
                      expert_parallel=expert_parallel, num_params=int(sharded.num_params),
                      num_expert_params=int(sharded.num_expert_params),
                      sharded_total_bytes=int(sharded.total_bytes), excluded_total_bytes=int(excluded.total_bytes),
                      sharded_model_state_bytes=int(sharded.model_state_bytes),
                      excluded_model_state_bytes=int(excluded.model_state_bytes),
                      expert_states_bytes=int(layout[layout.held_as == "experts"].model_state_bytes.sum()))


def moe_accumulation_table(preset_name: str, num_shards: int, num_microbatches: int = 8,
                           expert_parallel_degrees: Sequence[int | None] = (None,), *,
                           strategy: str = "zero3", **knobs) -> "pd.DataFrame":
    """Per-rank memory of an MoE preset with G micro-batches: synced every micro-batch, or deferred
    as ``MoEFSDPSyncMixin`` does (experts gathered and their gradients unsharded until the final
    backward), next to G = 1; one row per (policy, mode).

    Args:
        preset_name, num_shards, strategy, **knobs: As in :func:`moe_memory_table` (``knobs``
            should hold one micro-batch's ``activation_bytes``, if any).
        num_microbatches: G > 1.
        expert_parallel_degrees: As in :func:`moe_memory_table`.

    Returns:
        Columns ``policy``, ``mode`` (``"G = 1"``, ``"every micro-batch"``, ``"deferred (the mixin)"``),
        ``accumulator_bytes``, ``gathered_bytes`` (the ``gathered_unit`` row), ``model_state_bytes``,
        ``total_bytes`` and ``total_vs_g1`` (over the same policy's G = 1 total).

    Raises:
        ValueError: as :func:`moe_memory_table`, or G < 2.
    """
    import pandas as pd

    num_microbatches = integer("num_microbatches", num_microbatches, low=2)  # G = 1 has no modes to compare
    spec, num_experts = moe_preset(preset_name)
    rows = []
    for k in check_expert_parallel(expert_parallel_degrees, num_experts):
        for mode, g, defer in (("G = 1", 1, True), ("every micro-batch", num_microbatches, False),
                               ("deferred (the mixin)", num_microbatches, True)):
            est = estimate_memory(spec, strategy, num_shards, expert_parallel=k, num_microbatches=g,
                                  defer_sync=defer, **knobs)
            rows.append(dict(preset=preset_name, num_shards=num_shards, policy=policy_label(k), mode=mode, G=g,
                             accumulator_bytes=est["gradient_accumulator"], gathered_bytes=est["gathered_unit"],
                             model_state_bytes=est.model_state_bytes, total_bytes=est.total_bytes))
    table = pd.DataFrame(rows)
    first = table.groupby("policy", sort=False).total_bytes.transform("first")
    table["total_vs_g1"] = table.total_bytes / first
    return table


def moe_summary_table(presets: Sequence[str], num_shards: int, expert_parallel_degrees: Sequence[int], *,
                      strategy: str = "zero3", **knobs) -> "pd.DataFrame":
    """:func:`moe_summary` for each preset and EP degree, one row each: expert share and GB per rank
    with experts sharded by FSDP against outside it (``ratio``: outside over sharded, peak)."""
    import pandas as pd

    rows = []
    for k in expert_parallel_degrees:
        for p in presets:
            s = moe_summary(p, num_shards, k, strategy=strategy, **knobs)
            rows.append({"preset": p, "N": s.num_shards, "EP degree": k, "expert share": s.expert_share,
                         "GB per rank, experts sharded by FSDP": s.sharded_total_bytes / GB,
                         "GB per rank, experts outside FSDP": s.excluded_total_bytes / GB,
                         "ratio": s.excluded_over_sharded,
                         "model states ratio": s.excluded_model_state_bytes / s.sharded_model_state_bytes})
    return pd.DataFrame(rows)

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

import plotly.graph_objects as go

from workbench.core.presets import PRESETS, get_preset, is_expert_param
from workbench.core.specs import ModelSpec
from workbench.estimate.breakdown import MemoryEstimate
from workbench.estimate.knobs import SHARDED_STATES
from workbench.estimate.memory import estimate_memory
from workbench.views.style import KIND_COLORS, SERIES_COLORS, figure, param_kind

if TYPE_CHECKING:
    import pandas as pd

GB = 10**9
#: The default policies compared: experts sharded by FSDP, then experts outside FSDP with EP degree 1 and 4.
DEFAULT_EXPERT_PARALLEL = (None, 1, 4)
#: Segment patterns of :func:`fig_moe_rank_layout`: sharded by the FSDP group, or whole experts.
HELD_PATTERNS = {"fsdp": "", "experts": "x"}


def policy_label(expert_parallel: int | None) -> str:
    """A display name: ``None`` -> experts sharded by FSDP; k -> experts sharded by EP = k, outside FSDP."""
    if expert_parallel is None:
        return "experts sharded by FSDP"
    if expert_parallel == 1:
        return "experts outside FSDP, replicated"
    return f"experts outside FSDP, EP={expert_parallel}"


def _moe_preset(preset_name: str) -> tuple[ModelSpec, int]:
    """The spec of an MoE preset and its experts per block; ``ValueError`` naming the preset otherwise."""
    if preset_name not in PRESETS:
        raise ValueError(f"preset_name: unknown preset {preset_name!r}; known: {', '.join(sorted(PRESETS))}.")
    config = PRESETS[preset_name]
    if not config.is_moe:
        moe = sorted(k for k, c in PRESETS.items() if c.is_moe)
        raise ValueError(f"preset_name: {preset_name!r} is a dense model (no experts); MoE presets: {', '.join(moe)}.")
    return get_preset(preset_name), config.num_experts


def _check_degrees(degrees: Sequence[int | None], num_experts: int) -> tuple[int | None, ...]:
    degrees = tuple(degrees)
    if not degrees:
        raise ValueError("expert_parallel_degrees: need at least one policy (None, or an EP degree k >= 1).")
    for k in degrees:
        if k is None:
            continue
        if isinstance(k, bool) or not isinstance(k, int) or k < 1 or num_experts % k:
            raise ValueError(f"expert_parallel={k!r} must be None or an integer k >= 1 that divides the "
                             f"{num_experts} experts per block (each EP rank holds whole experts).")
    return degrees


def expert_params(spec: ModelSpec) -> int:
    """Elements of the routed-expert parameters of ``spec`` (:func:`~workbench.core.presets.is_expert_param`)."""
    return sum(p.size for p in spec if is_expert_param(p.path))


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

    spec, num_experts = _moe_preset(preset_name)
    degrees = _check_degrees(expert_parallel_degrees, num_experts)
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
    """What one rank holds, by parameter kind (:func:`~workbench.views.style.param_kind`), under one policy.

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

    spec, num_experts = _moe_preset(preset_name)
    (k,) = _check_degrees((expert_parallel,), num_experts)
    by_kind: dict[str, list] = {}
    for p in spec:
        by_kind.setdefault(param_kind(p.path), []).append(p)
    if strategy not in SHARDED_STATES:
        _estimate(spec, strategy, num_shards, k, knobs)  # raises, naming the strategy
    sharded_params = SHARDED_STATES[strategy][0]
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


def fig_moe_rank_layout(preset_name: str, num_shards: int = 8, expert_parallel: int = 1, *,
                        strategy: str = "zero3", height: int = 360, **knobs) -> go.Figure:
    """One rank's model states by parameter kind: experts sharded by FSDP vs by expert parallelism.

    Two horizontal stacked bars (GB per rank, :func:`moe_rank_layout` of each policy): segments
    coloured by kind (:data:`~workbench.views.style.KIND_COLORS`); solid segments are what the FSDP
    group shards (1/N), cross-hatched ones whole experts held outside FSDP. Hover gives the
    elements per rank and how they are held.

    Raises:
        ValueError: as :func:`moe_memory_table`; ``expert_parallel=None`` (the figure compares it with ``None``).
    """
    if expert_parallel is None:
        raise ValueError("expert_parallel: give the EP degree k >= 1 to compare with FSDP-sharded experts "
                         "(None is the other bar).")
    layouts = {policy_label(k): moe_rank_layout(preset_name, num_shards, k, strategy=strategy, **knobs)
               for k in (None, expert_parallel)}
    y = list(layouts)
    traces = []
    for kind in KIND_COLORS:
        for held, pattern in HELD_PATTERNS.items():
            rows = [t[(t.kind == kind) & (t.held_as == held)] for t in layouts.values()]
            if not any(len(r) for r in rows):
                continue
            x = [float(r.model_state_bytes.sum()) / GB if len(r) else 0.0 for r in rows]
            text = [f"{r.description.iloc[0]}: {r.params_per_rank.iloc[0]:,.0f} of {r.num_params.iloc[0]:,} "
                    "parameters" if len(r) else "" for r in rows]
            traces.append(dict(type="bar", orientation="h", y=y, x=x, name=kind if held == "fsdp" else
                               f"{kind} (whole experts, outside FSDP)", customdata=text,
                               marker=dict(color=KIND_COLORS[kind], line=dict(width=0), pattern=dict(shape=pattern)),
                               hovertemplate=f"{kind}: %{{x:.3f}} GB per rank<br>%{{customdata}}<extra></extra>"))
    title = (f"{preset_name}: what one of {num_shards} ranks holds ({strategy}), model states by parameter kind"
             "<br><sup>solid: 1/N shards of the FSDP group; crossed: whole experts held outside FSDP "
             "(expert parallelism)</sup>")
    layout = dict(barmode="stack", xaxis=dict(title=dict(text="GB per rank (parameters, gradients, optimizer "
                                                                "state)")),
                  yaxis=dict(autorange="reversed"), margin=dict(l=280, r=20, t=80, b=60),
                  legend=dict(orientation="h", yanchor="top", y=-0.25, x=0, traceorder="normal"))
    return figure(traces, layout, title, height)


def fig_moe_memory_vs_shards(preset_name: str, num_shards: Sequence[int] = (8, 16, 32, 64, 128),
                             expert_parallel_degrees: Sequence[int | None] = (None, 1), *,
                             strategy: str = "zero3", height: int = 400, **knobs) -> go.Figure:
    """Per-rank peak (GB) against N, one bar series per policy (:func:`moe_memory_table` at each N).

    With experts sharded by FSDP the whole model shrinks as 1/N; with experts outside FSDP
    only the non-expert part does, and the bars flatten at the experts' ``Psi_e / k`` share.

    Raises:
        ValueError: as :func:`moe_memory_table`, or on no N.
    """
    import pandas as pd

    if not len(num_shards):
        raise ValueError("num_shards: need at least one FSDP degree N.")
    table = pd.concat([moe_memory_table(preset_name, n, expert_parallel_degrees, strategy=strategy, **knobs)
                       for n in num_shards], ignore_index=True)
    traces = []
    for i, policy in enumerate(dict.fromkeys(table.policy)):
        rows = table[table.policy == policy]
        traces.append(dict(type="bar", x=[f"N={n}" for n in rows.num_shards], y=list(rows.total_bytes / GB),
                           name=policy, marker=dict(color=SERIES_COLORS[i % len(SERIES_COLORS)]),
                           text=[f"{v:.3g}" for v in rows.total_bytes / GB], textposition="outside",
                           hovertemplate=f"{policy}<br>%{{x}}: %{{y:.3f}} GB per rank<extra></extra>"))
    share = table.expert_share.iloc[0]
    title = (f"{preset_name} ({strategy}): memory per rank against the FSDP degree N<br><sup>experts are "
             f"{share:.1%} of the parameters; model states plus the estimate's transients</sup>")
    layout = dict(barmode="group", yaxis=dict(title=dict(text="GB per rank")), xaxis=dict(title=dict(text="N")))
    return figure(traces, layout, title, height)


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

    if isinstance(num_microbatches, bool) or not isinstance(num_microbatches, int) or num_microbatches < 2:
        raise ValueError(f"num_microbatches must be an integer >= 2 to compare the modes, got {num_microbatches!r}.")
    spec, num_experts = _moe_preset(preset_name)
    rows = []
    for k in _check_degrees(expert_parallel_degrees, num_experts):
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

"""Figures of the MoE study (notebook 03): what each rank holds under each expert policy, and memory
against the number of shards. The tables behind them are :mod:`workbench.studies.moe`'s."""

from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go

from workbench.estimate.moe import (
    policy_label,
)
from workbench.studies.moe import GB, moe_memory_table, moe_rank_layout
from workbench.views.style import KIND_COLORS, SERIES_COLORS, figure

#: Segment patterns of :func:`fig_moe_rank_layout`: sharded by the FSDP group, or whole experts.
HELD_PATTERNS = {"fsdp": "", "experts": "x"}


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
            traces.append(dict(type="bar", orientation="h", y=y, x=x, name=kind if held != "experts" else
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

"""The design review's words, computed from its numbers (issue 29, item 11): the key numbers as a table a person
reads, the step-time sentence, the memory slide's assumptions, row against flat step time from the reference
runs, and the recommendation itself. A sentence here that states a figure takes it from the data it describes:
the deck once said "a few percent of step time" above +13.1% on the same slide.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from workbench.core.units import format_number
from workbench.strategies import get_strategy
from workbench.studies.design_review import key_numbers, step_time_table
from workbench.studies.runs import is_ddp
from workbench.studies.step_time import steady_steps
from workbench.views.memory import over_capacity
from workbench.views.style import TEMPLATE, subplot_grid

COLORS = {"ddp": "#4C78A8", "fsdp-row": "#F58518", "fsdp-flat": "#54A24B", "fsdp-full": "#B279A2"}


def key_numbers_table(numbers: pd.Series) -> pd.DataFrame:
    """:func:`~workbench.studies.design_review.key_numbers` as the slide shows it: one row per number, its
    source and what it is in words, the value formatted (no ``dtype: float64``)."""
    rows = []
    for name, value in numbers.items():
        source, _, what = str(name).partition(": ")
        rows.append({"source": source, "number": what, "value": format_number(value)})
    return pd.DataFrame(rows).set_index(["source", "number"])


def step_time_sentence(table: pd.DataFrame | None = None) -> str:
    """FSDP's step-time overhead over DDP in MLX PR #3130's table, by precision: its range and the worst case."""
    t = step_time_table() if table is None else table
    parts = []
    for column, precision in (("fsdp_overhead_pct", "fp32"), ("fsdp_bf16_overhead_pct", "bf16")):
        values = t[column]
        parts.append(f"in {precision} {values.min():+.1f}% to {values.max():+.1f}% (worst: {values.idxmax()})")
    return (f"FSDP's step over DDP's on 8 GPUs (MLX PR #3130): {'; '.join(parts)}. The reduce-scatter and "
            "all-gather move the bytes of one all-reduce; the extra launch per bucket weighs more where the step "
            "is shorter.")


def memory_assumptions(estimates, *, micro_batch_size: int, seq_len: int, capacity_bytes: float | None = None) -> str:
    """What the memory slide's bars (``estimates``, from :func:`~workbench.estimate.grid.estimate_breakdowns`)
    assume, with the activations' bytes in them: the sequences and tokens per rank, no fused attention (each
    head's s x s scores held for backward), no activation recompute; and the device's capacity they are read
    against, naming the strategies over it."""
    gb = lambda b: f"{b / 1e9:,.1f} GB"  # noqa: E731 - the unit of the slide's bars
    acts = max(e["activations"] for e in estimates)
    said = (f"Activations: {micro_batch_size} x {seq_len:,} tokens per rank, no fused attention (every head's "
            f"{seq_len:,} x {seq_len:,} scores kept for backward), no recompute: {gb(acts)} per rank "
            f"under every strategy, at N = {', '.join(sorted({str(e.num_shards) for e in estimates}))}.")
    if capacity_bytes is not None:
        over = [f"{e.strategy} ({gb(e.total_bytes)})" for e in over_capacity(estimates, capacity_bytes)]
        said += (f" Device capacity {gb(capacity_bytes)}: "
                 + (f"over it: {', '.join(over)}." if over else "every strategy fits."))
    return said


def row_flat_table(loaded) -> pd.DataFrame:
    """Per framework and strategy of a store's done runs: the median step after warm-up (slowest rank per step)
    with its quartiles, the steps it rests on, and each FSDP layout's median over DDP's."""
    runs = loaded.runs[loaded.runs.status == "done"]
    rows = []
    for _, run in runs.iterrows():
        steps = loaded.steps[loaded.steps.run_id == run.run_id]
        per_step = steady_steps(steps, "step_time_s")
        if per_step is None:
            continue
        ms = per_step * 1e3
        rows.append({"framework": run["spec.framework"], "strategy": run["spec.strategy"], "median_ms": ms.median(),
                     "p25_ms": ms.quantile(0.25), "p75_ms": ms.quantile(0.75), "steps": int(steps.step.nunique())})
    t = pd.DataFrame(rows)
    if t.empty:
        raise ValueError("row_flat_table: the store has no done run with step times.")
    ddp = t[t.strategy.map(is_ddp)].set_index("framework").median_ms
    t["over_ddp"] = [r.median_ms / ddp[r.framework] if r.framework in ddp else None for r in t.itertuples()]
    return t.sort_values(["framework", "strategy"]).set_index(["framework", "strategy"])


def row_flat_sentences(table: pd.DataFrame) -> list[str]:
    """Per framework, flat's median step against row's, and whether the runs' spread can tell them apart (the
    medians differ by more than either's interquartile range)."""
    out = []
    for fw in table.index.get_level_values("framework").unique():
        t = table.loc[fw]
        records = {s: get_strategy(s) for s in t.index}
        by_layout = {r.layout: s for s, r in records.items() if r.units == "buckets" and r.layout}  # ZeRO-1/2-like
        if not {"row", "flat"} <= set(by_layout):
            continue
        row, flat = t.loc[by_layout["row"]], t.loc[by_layout["flat"]]
        spread = max(row.p75_ms - row.p25_ms, flat.p75_ms - flat.p25_ms)
        apart = abs(flat.median_ms - row.median_ms) > spread
        out.append(f"{fw}: flat's median step is {flat.median_ms / row.median_ms:.2f}x row's ({flat.median_ms:.3g} "
                   f"against {row.median_ms:.3g} ms, over {int(min(row.steps, flat.steps))} steps); "
                   + ("the difference is larger than the runs' spread" if apart else
                      f"within the runs' spread of {spread:.3g} ms: no measured difference"))
    return out


def fig_row_flat(table: pd.DataFrame, *, height: int = 420) -> go.Figure:
    """Median step per strategy, one panel per framework (each on its own scale), with the interquartile range
    over steps as error bars."""
    frameworks = list(table.index.get_level_values("framework").unique())
    layout, refs = subplot_grid(1, len(frameworks), frameworks, hspace=0.08)
    fig = go.Figure(layout=dict(template=TEMPLATE, height=height, showlegend=False, margin=dict(t=90), **layout,
                                title="Row against flat: step time from the reference runs (median, quartiles over steps)"))
    order = {"ddp": 0, "fsdp-row": 1, "fsdp-flat": 2}
    for (x, y), fw in zip(refs, frameworks):
        t = table.loc[fw].sort_index(key=lambda idx: [order.get(s, 3) for s in idx])
        fig.add_trace(go.Bar(x=list(t.index), y=t.median_ms.tolist(), xaxis=x, yaxis=y, name=fw,
                             marker_color=[COLORS.get(s, "#9D9D9D") for s in t.index],
                             text=[f"{v:.3g} ms" for v in t.median_ms], textposition="inside", insidetextanchor="start",
                             error_y=dict(type="data", symmetric=False, array=(t.p75_ms - t.median_ms).tolist(),
                                          arrayminus=(t.median_ms - t.p25_ms).tolist(), color="#333333")))
        fig.layout[f"yaxis{y[1:]}"].update(rangemode="tozero", title="ms per step" if y == "y" else None)
    return fig


def recommendation(gap, validation: pd.DataFrame, advice=None) -> str:
    """The recommendation slide as Markdown, every figure in it from :func:`key_numbers` and the advice."""
    k = key_numbers(gap, validation, advice)
    value = {str(name).partition(": ")[2]: v for name, v in k.items()}
    fp32, bf16 = (value[f"FSDP step-time overhead over DDP, {p}, worst (%)"] for p in ("fp32", "bf16"))
    state = value["FSDP optimizer-side state / DDP's, measured, worst"]
    buckets = ("* **Buckets:** keep MLX's 32 MiB for multi-billion-parameter models: the arrays, not the knob, set "
               "the collective count. For smaller ones, take the size `recommend_communication_size` advises on "
               "your machine's measured links")
    if advice is not None:
        buckets += (f" (on the reference machine it advised {advice.advice.communication_size / 2**20:g} MiB, which ran "
                    f"{advice.gap * 100:+.1f}% against the best size measured; {advice.verdict()})")
    return "\n".join([
        "## Recommendation", "", buckets + ".",
        "* **Layout:** row and flat hold the same bytes and make the same collectives. Use **flat** when arrays "
        "do not divide N (no constraint, tiny padding); **row** when moving to full parameter sharding, where "
        "per-array shards are the unit to gather.",
        f"* **FSDP:** adopt it where optimizer state is a large share of the peak: it trains like DDP (the runs "
        f"above); on 2 ranks each held at most {state:.2f} of DDP's optimizer-side state (half of AdamW's moments, "
        f"and the resident step's 1/N master shard); on 8 GPUs it cost up to "
        f"{fp32:+.1f}% of step time in fp32 and {bf16:+.1f}% in bf16 (MLX PR #3130).",
        "* **MLX's `fully_shard` (MLX >= 0.32.1):** it keeps every gathered unit until backward, so it holds less "
        "than `fsdp_apply_gradients` only as N grows (the comparison above).",
    ])

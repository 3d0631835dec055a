"""The design review's own content (``notebooks/00_design_review.ipynb``): MLX PR #3130's step times, the
numbers the recommendation cites, and the committed reference run stores the deck reads (it never trains)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from workbench.core import paths
from workbench.core.units import KiB, MiB
from workbench.runs.spec import VALIDATION_MODEL
from workbench.runs.tables import load_runs
from workbench.strategies import get_strategy
from workbench.studies.advice import AdviceCheck, advice_against_sweep
from workbench.studies.step_time import fit_links, load_collective_benchmarks
from workbench.views.style import TEMPLATE

#: MLX PR #3130 "FSDP (easy)", step time in ms on 8 GPUs: (params, communication_size in MiB,
#: DDP, FSDP, DDP bf16, FSDP bf16). Source: the PR's benchmark table (seed 003 in shared/).
PR3130_STEP_TIMES_MS = (
    ("0.3B", 16, 6.96, 6.94, 5.54, 5.38),
    ("2.7B", 32, 33.54, 34.79, 24.65, 27.89),
    ("5.4B", 16, 63.07, 65.23, 45.59, 47.44),
)


#: The committed run stores the deck reads (``scripts/make_reference_runs.py`` makes them), by name:
#: ``(framework, strategy)`` pairs and the spec fields they share.
#:
#: * ``convergence``: a 0.4M-parameter LM on a 64-token Markov chain, near its entropy floor in 100
#:   steps; every strategy in MLX and JAX (ZeRO-3 in JAX only).
#: * ``memory``: notebook 03's validation runs (a 3.4M-parameter LM, 3 steps), large enough for the
#:   memory model's peak to be compared with MLX's measured one; MLX's own ``fully_shard`` beside the
#:   workbench's FSDP step and ZeRO-3 on it (:func:`workbench.studies.fully_shard.fully_shard_comparison`).
REFERENCE_STORES = {
    "convergence": (
        (("mlx", "ddp"), ("mlx", "fsdp-row"), ("mlx", "fsdp-flat"),
         ("jax", "ddp"), ("jax", "fsdp-row"), ("jax", "fsdp-flat"), ("jax", "fsdp-full")),
        dict(num_ranks=2, steps=100, global_batch=16,
             model=dict(vocab_size=64, seq_len=32, dim=128, num_layers=2, num_heads=4, mlp_dim=512),
             optimizer="adamw", learning_rate=3e-3, communication_size=256 * 1024, data_seed=0, concentration=0.1),
    ),
    "memory": (
        (("mlx", "ddp"), ("mlx", "fsdp-row"), ("mlx", "fsdp-flat"), ("mlx", "fsdp-full"), ("mlx", "mlx-fully-shard"),
         ("jax", "ddp"), ("jax", "fsdp-full")),
        dict(num_ranks=2, steps=3, global_batch=8, communication_size=2**20,
             model=VALIDATION_MODEL),
    ),
}


#: The bucket-size sweep the deck's advice slide reads (``scripts/make_reference_runs.py comm-size``):
#: the collective benchmark of the machine (``collectives``, MLX ring, 2 ranks) and FSDP-row runs of
#: notebook 03's 3.4M-parameter LM at each size (``comm-size``), so the advisor is asked about a
#: measured sweep on the links of the same machine.
REFERENCE_SWEEP = dict(
    sizes=(64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB),
    collective_sizes=tuple(2**k for k in range(12, 27, 2)),  # 4 KiB to 64 MiB
    spec=dict(framework="mlx", strategy="fsdp-row", num_ranks=2, steps=10, global_batch=8, model=VALIDATION_MODEL,
              optimizer="adamw"),
)

#: Stores of :data:`REFERENCE_SWEEP`.
SWEEP_STORES = ("comm-size", "collectives")


def reference_runs_dir(name: str = "convergence") -> Path:
    """A committed run store the deck reads: ``notebooks/reference_runs/<name>`` (see :data:`REFERENCE_STORES`
    and :data:`REFERENCE_SWEEP`).

    Raises:
        ValueError: on an unknown store name.
    """
    if name not in REFERENCE_STORES and name not in SWEEP_STORES:
        raise ValueError(f"Unknown reference run store {name!r}; known: {', '.join([*REFERENCE_STORES, *SWEEP_STORES])}.")
    return paths.NOTEBOOK_DIR / "reference_runs" / name


def reference_advice() -> AdviceCheck:
    """The bucket-size advisor on the reference machine's fitted links, against its measured sweep."""
    links = fit_links(load_collective_benchmarks(reference_runs_dir("collectives")))
    return advice_against_sweep(load_runs(reference_runs_dir("comm-size")), links,
                                strategy=REFERENCE_SWEEP["spec"]["strategy"])


def step_time_table() -> pd.DataFrame:
    """PR #3130's DDP and FSDP step times, with FSDP's overhead over DDP in percent."""
    df = pd.DataFrame(PR3130_STEP_TIMES_MS, columns=["params", "communication_size_MiB", "ddp_ms", "fsdp_ms",
                                                     "ddp_bf16_ms", "fsdp_bf16_ms"])
    df["fsdp_overhead_pct"] = (100 * (df.fsdp_ms / df.ddp_ms - 1)).round(1)
    df["fsdp_bf16_overhead_pct"] = (100 * (df.fsdp_bf16_ms / df.ddp_bf16_ms - 1)).round(1)
    return df.set_index("params")


#: Reader-facing headers of :func:`step_time_table` (short enough for a slide's width).
STEP_TIME_HEADERS = {"communication_size_MiB": "buckets (MiB)", "ddp_ms": "DDP fp32 (ms)", "fsdp_ms": "FSDP fp32 (ms)",
                     "ddp_bf16_ms": "DDP bf16 (ms)", "fsdp_bf16_ms": "FSDP bf16 (ms)",
                     "fsdp_overhead_pct": "FSDP over DDP, fp32 (%)", "fsdp_bf16_overhead_pct": "FSDP over DDP, bf16 (%)"}


def step_time_display(table: pd.DataFrame | None = None) -> pd.DataFrame:
    """:func:`step_time_table` as a slide shows it: headers in words with units, the model size as rows."""
    t = step_time_table() if table is None else table
    return t.rename(columns=STEP_TIME_HEADERS).rename_axis("parameters")


def fig_step_time_table(table: pd.DataFrame | None = None, *, height: int = 420) -> go.Figure:
    """FSDP's step time against DDP's (PR #3130): grouped bars in ms, overhead in percent on top."""
    t = step_time_table() if table is None else table
    fig = go.Figure(layout=dict(template=TEMPLATE, height=height, barmode="group", yaxis_title="ms per step",
                                title="Step time, DDP vs FSDP on 8 GPUs (MLX PR #3130)",
                                legend=dict(orientation="h", y=-0.15)))
    x = [f"{p}, {c} MiB buckets" for p, c in zip(t.index, t.communication_size_MiB)]
    for col, name, color in (("ddp_ms", "DDP fp32", "#4C78A8"), ("fsdp_ms", "FSDP fp32", "#F58518"),
                             ("ddp_bf16_ms", "DDP bf16", "#9ECAE9"), ("fsdp_bf16_ms", "FSDP bf16", "#FFBF79")):
        over = {"fsdp_ms": t.fsdp_overhead_pct, "fsdp_bf16_ms": t.fsdp_bf16_overhead_pct}.get(col)
        fig.add_trace(go.Bar(x=x, y=t[col].tolist(), name=name, marker_color=color,
                             text=None if over is None else [f"{v:+.1f}%" for v in over], textposition="outside"))
    return fig


def key_numbers(gap, validation: pd.DataFrame, advice: AdviceCheck | None = None) -> pd.Series:
    """The numbers the recommendation cites, each computed here.

    Args:
        gap: :func:`workbench.estimate.cases.explain_qwen_3_7b` (MLX PR #3130's measured peaks).
        validation: :func:`workbench.studies.memory.memory_validation` of the reference runs.
        advice: :func:`reference_advice`, if the bucket-size advice is to be cited.

    Raises:
        ValueError: if ``validation`` lacks the MLX DDP and FSDP runs it compares.
    """
    t = step_time_table()
    mlx = validation[validation.framework == "mlx"]
    state = mlx[mlx.component == "optimizer_state"].groupby("strategy").measured_bytes.max()
    replicated = {s: get_strategy(s).family == "data_parallel" for s in state.index}
    ddp_state = [v for s, v in state.items() if replicated[s]]
    fsdp_states = [v for s, v in state.items() if not replicated[s]]
    if not ddp_state or not fsdp_states:
        raise ValueError("key_numbers: validation needs MLX ddp and fsdp runs with measured optimizer state.")
    fsdp_state = max(fsdp_states)
    error = (mlx.ratio - 1).abs()
    return pd.Series({
        "Qwen 3.7B, 8 GPUs: DDP - FSDP peak, measured (GB)": round(gap.measured_difference_bytes / 1e9, 1),
        "Qwen 3.7B, 8 GPUs: DDP - FSDP, modelled (GB)": round(gap.predicted_difference_bytes / 1e9, 1),
        "PR #3130: FSDP step-time overhead over DDP, fp32, worst (%)": float(t.fsdp_overhead_pct.max()),
        "PR #3130: FSDP step-time overhead over DDP, bf16, worst (%)": float(t.fsdp_bf16_overhead_pct.max()),
        "reference runs, 2 ranks: FSDP optimizer-side state / DDP's, measured, worst": round(
            fsdp_state / max(ddp_state), 3),
        "reference runs, MLX: worst |measured / modelled - 1|, peak (%)": round(
            100 * float(error[mlx.component == "peak"].max()), 1),
        "reference runs, MLX: worst |measured / modelled - 1|, parameters and state (%)": round(
            100 * float(error[mlx.component != "peak"].max()), 1),
    } | ({} if advice is None else {
        "bucket advisor, reference machine: advised communication_size (MiB)": advice.advice.communication_size / MiB,
        "bucket advisor, reference machine: measured step there over the best size's (%)": round(100 * advice.gap, 1),
    }))

"""Step time and communication from stored runs, beside what the models predict.

* :func:`predict_sync_s` -- the alpha-beta time of one step's collectives
  (:func:`workbench.estimate.comm.estimate_comm` on the run's bucket plan, with the constants
  :func:`workbench.studies.step_time.fit_links` fitted per framework and collective kind).
* :func:`comm_size_table` / :func:`fig_comm_size_sweep` -- per stored run: measured step and
  sync time and peak memory against ``communication_size``, with the predicted sync time
  and the memory model's peak (:func:`workbench.runs.estimate.estimate_run_memory`).
* :func:`pr_step_table` -- DDP against FSDP step time, fp32 and bf16, in the shape of the
  table of MLX PR #3130.
* :func:`fig_collective_bandwidth` -- nccl-tests' bus bandwidth against size, and the fit.

Measured times are medians after :data:`workbench.studies.runs.WARMUP_STEPS`, of the slowest rank.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from workbench.core.buckets import plan_buckets
from workbench.estimate.comm import AlphaBeta, CommEstimate, bus_factor, estimate_comm, fit_alpha_beta, ring_steps
from workbench.runs.estimate import estimate_run_memory, run_model_spec, spec_from_row
from workbench.runs.spec import shard_groups
from workbench.runs.store import RunStore
from workbench.studies.runs import after_warmup
from workbench.views.style import TEMPLATE

#: Run strategy -> the communication model's strategy.


def predict_sync_s(comm: CommEstimate, links: Mapping[tuple[str, str], AlphaBeta], framework: str) -> float:
    """Seconds of one step's collectives, each kind with its own fitted link; nothing overlaps.

    Raises:
        KeyError: naming the framework and kind with no fitted link.
    """
    total = 0.0
    for c in comm.collectives:
        if (framework, c.kind) not in links:
            raise KeyError(f"No fitted link for {framework} {c.kind}: run the collective benchmark for it.")
        total += float(links[(framework, c.kind)].predict_s(c.rank_bytes, c.num_steps))
    return total


def steady_steps(steps: pd.DataFrame, column: str) -> pd.Series | None:
    """The slowest rank's value per step, after warm-up (:func:`workbench.studies.runs.after_warmup`, the
    selection :func:`~workbench.studies.runs.summarize_runs` makes too); None where ``column`` holds no value."""
    if column not in steps or steps[column].isna().all():
        return None
    return after_warmup(steps.groupby("step")[column].max())


def steady_median(steps: pd.DataFrame, column: str) -> float | None:
    """Median over steps after warm-up of the slowest rank's value."""
    per_step = steady_steps(steps, column)
    return None if per_step is None else float(per_step.median())


def steady_quartiles(steps: pd.DataFrame, column: str) -> tuple[float, float] | None:
    """The 25th and 75th percentiles over steps after warm-up of the slowest rank's value: the spread a
    median from :func:`steady_median` carries."""
    per_step = steady_steps(steps, column)
    return None if per_step is None else (float(per_step.quantile(0.25)), float(per_step.quantile(0.75)))


def comm_size_table(loaded, links: Mapping[tuple[str, str], AlphaBeta] | None = None) -> pd.DataFrame:
    """One row per done run: its ``communication_size``, buckets, measured step / sync ms, peak MiB,
    and the predictions (sync ms from ``links`` if given; peak MiB from the memory model)."""
    rows = []
    runs = loaded.runs
    for _, run in runs[runs.status == "done"].iterrows():
        spec = spec_from_row(run)
        steps = loaded.steps[loaded.steps.run_id == run.run_id]
        buckets = plan_buckets(run_model_spec(spec), spec["communication_size"])
        n, replicas = shard_groups(spec)
        comm = estimate_comm(buckets, spec["strategy"], n, num_replicas=replicas)
        step_s, sync_s = steady_median(steps, "step_time_s"), steady_median(steps, "sync_time_s")
        quartiles = steady_quartiles(steps, "step_time_s") or (None, None)
        peak = steps["peak_array_bytes"].max() if "peak_array_bytes" in steps and steps["peak_array_bytes"].notna().any() else None
        rows.append({
            "run_id": run.run_id, "framework": spec["framework"], "strategy": spec["strategy"],
            "precision": spec["precision"], "num_params": buckets.spec.num_params,
            "communication_size": spec["communication_size"], "num_buckets": buckets.num_buckets,
            "num_collectives": comm.num_collectives, "rank_mib_sent": comm.rank_bytes / 2**20,
            "step_ms": None if step_s is None else step_s * 1e3,
            "step_p25_ms": None if quartiles[0] is None else quartiles[0] * 1e3,
            "step_p75_ms": None if quartiles[1] is None else quartiles[1] * 1e3,
            "sync_ms": None if sync_s is None else sync_s * 1e3,
            "predicted_sync_ms": predict_sync_s(comm, links, spec["framework"]) * 1e3 if links else None,
            "peak_mib": None if peak is None else float(peak) / 2**20,
            "predicted_peak_mib": estimate_run_memory(spec).total_bytes / 2**20,
        })
    columns = ["run_id", "framework", "strategy", "precision", "num_params", "communication_size", "num_buckets",
               "num_collectives", "rank_mib_sent", "step_ms", "step_p25_ms", "step_p75_ms", "sync_ms", "predicted_sync_ms",
               "peak_mib",
               "predicted_peak_mib"]
    return pd.DataFrame(rows, columns=columns).sort_values(
        ["framework", "strategy", "precision", "num_params", "communication_size"], ignore_index=True)


def pr_step_table(table: pd.DataFrame, fsdp: str = "fsdp-row") -> pd.DataFrame:
    """DDP against FSDP median step time in ms, in the columns of MLX PR #3130's table.

    Rows are (parameters, communication size) pairs with at least one DDP or FSDP run; a missing
    combination is NaN. ``fsdp`` picks the layout (PR #3130's final algorithm is the row layout).
    """
    t = table[table.strategy.isin(["ddp", fsdp])]
    out = t.pivot_table(index=["num_params", "communication_size"], columns=["strategy", "precision"],
                        values="step_ms", aggfunc="median")
    names = {("ddp", "float32"): "DDP (ms)", (fsdp, "float32"): "FSDP (ms)",
             ("ddp", "bfloat16"): "DDP bf16 (ms)", (fsdp, "bfloat16"): "FSDP bf16 (ms)"}
    out = out.reindex(columns=list(names)).set_axis(list(names.values()), axis=1).reset_index()
    out.insert(0, "params", [f"{p / 1e6:.1f}M" for p in out.num_params])
    out.insert(1, "comm size", [f"{c / 2**20:g} MiB" for c in out.communication_size])
    return out.drop(columns=["num_params", "communication_size"])


def fig_comm_size_sweep(table: pd.DataFrame, *, height: int = 460) -> go.Figure:
    """Measured step and sync time (left) and peak memory (right) against ``communication_size``,
    each strategy with its prediction dashed."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("time per step (ms)", "peak memory per rank (MiB)"))
    colors = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2"]
    for i, ((framework, strategy, precision), g) in enumerate(table.groupby(["framework", "strategy", "precision"])):
        name, color = f"{framework} {strategy} {precision}", colors[i % len(colors)]
        x = (g.communication_size / 2**20).tolist()
        series = [(1, "step_ms", "step", "solid"), (1, "sync_ms", "sync", "dot"),
                  (1, "predicted_sync_ms", "sync predicted", "dash"),
                  (2, "peak_mib", "peak", "solid"), (2, "predicted_peak_mib", "peak predicted", "dash")]
        for col, column, what, dash in series:
            if g[column].isna().all():
                continue
            fig.add_trace(go.Scatter(x=x, y=g[column].tolist(), mode="lines+markers", name=f"{name}: {what}",
                                     legendgroup=name, line=dict(color=color, dash=dash)), row=1, col=col)
    fig.update_xaxes(type="log", title_text="communication_size (MiB)")
    fig.update_layout(template=TEMPLATE, height=height, title="communication_size sweep: measured (solid, dotted) "
                      "and predicted (dashed)")
    return fig


def fig_collective_bandwidth(table: pd.DataFrame, links: Mapping[tuple[str, str], AlphaBeta] | None = None, *,
                             height: int = 420) -> go.Figure:
    """Bus bandwidth (nccl-tests' busbw, GB/s) against message size, per framework and collective;
    the alpha-beta fit as a dashed line where ``links`` has it."""
    fig = go.Figure(layout=dict(template=TEMPLATE, height=height, title="Collective bus bandwidth (nccl-tests convention)",
                                xaxis=dict(title="message size (bytes)", type="log"),
                                yaxis=dict(title="busbw (GB/s)")))
    for (framework, kind), g in table.groupby(["framework", "kind"], sort=True):
        name = f"{framework} {kind}"
        fig.add_trace(go.Scatter(x=g.size_bytes.tolist(), y=(g.busbw_bytes_per_s / 1e9).tolist(), mode="lines+markers",
                                 name=name, legendgroup=name))
        if links and (framework, kind) in links:
            t = links[(framework, kind)].predict_s(g.rank_bytes.to_numpy(), g.num_steps.to_numpy())
            busbw = g.rank_bytes.to_numpy() / np.asarray(t) / 1e9  # rank_bytes = V * factor
            fig.add_trace(go.Scatter(x=g.size_bytes.tolist(), y=busbw.tolist(), mode="lines", name=f"{name} fit",
                                     legendgroup=name, line=dict(dash="dash"), showlegend=False))
    return fig


def links_table(links: Mapping[tuple[str, str], AlphaBeta]) -> pd.DataFrame:
    """The fitted constants: latency per ring step in microseconds and bandwidth in GB/s."""
    return pd.DataFrame([{"framework": f, "kind": k, "alpha_us": ab.alpha_s * 1e6, "beta_gb_per_s": ab.beta_bytes_per_s / 1e9}
                         for (f, k), ab in sorted(links.items())])


#: The placement of a benchmark run on one machine (its ranks talk over loopback).
LOOPBACK = "loopback"


def placement_label(placement: dict | None) -> str:
    """Where a benchmark ran: :data:`LOOPBACK`, or e.g. ``"2 hosts (ssh)"`` from a cross-host spec's placement."""
    if not placement:
        return LOOPBACK
    return f"{len(placement.get('hosts', []))} hosts ({placement.get('launcher', '?')})"


def load_collective_benchmarks(root: Path | str) -> "pd.DataFrame":
    """Stored benchmarks under ``root`` as one row per (run, kind, size): ``time_s`` (max over
    ranks of each rank's median), ``mean_s`` (max over ranks of each rank's mean: what a step that issues many
    such calls pays where some of them stall), ``algbw_bytes_per_s``, ``busbw_bytes_per_s``, ``rank_bytes``
    (bytes each rank sends: ``V * bus factor``), ``num_steps`` (ring latency terms) and
    ``placement`` (:func:`placement_label`: loopback, or the hosts a cross-host run used)."""
    import pandas as pd

    rows = []
    root = Path(root)
    for folder in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        record = RunStore(root).load_record(folder.name)
        if not record or record.get("status") != "done" or record["spec"].get("kind") != "collectives":
            continue
        spec, ranks = record["spec"], record["summary"]["ranks"]
        n = spec["num_ranks"]
        for key in ranks[0]["times_s"]:
            kind, size = key.split(":")
            size = int(size)
            t = max(statistics.median(r["times_s"][key]) for r in ranks)
            mean = max(statistics.fmean(r["times_s"][key]) for r in ranks)
            rows.append({"run_id": record["run_id"], "framework": spec["framework"], "num_ranks": n, "kind": kind,
                         "size_bytes": size, "time_s": t, "mean_s": mean, "algbw_bytes_per_s": size / t,
                         "busbw_bytes_per_s": size / t * bus_factor(kind, n), "rank_bytes": size * bus_factor(kind, n),
                         "num_steps": ring_steps(kind, n), "path": ranks[0]["paths"].get(kind, kind),
                         "placement": placement_label(spec.get("placement"))})
    columns = ["run_id", "framework", "num_ranks", "kind", "size_bytes", "time_s", "mean_s", "algbw_bytes_per_s",
               "busbw_bytes_per_s", "rank_bytes", "num_steps", "path", "placement"]
    return pd.DataFrame(rows, columns=columns).sort_values(["framework", "kind", "size_bytes"], ignore_index=True)


#: What a link is fitted to, by name: the column of :func:`load_collective_benchmarks`.
LINK_STATISTICS = {"median": "time_s", "mean": "mean_s"}


def fit_links(table: "pd.DataFrame", placement: str = LOOPBACK, num_ranks: int | None = None, *,
              statistic: str = "median") -> dict[tuple[str, str], AlphaBeta]:
    """Alpha-beta constants per ``(framework, kind)``, least squares of relative error over every
    stored size (``t = alpha * ring steps + bytes sent per rank / beta``), from the rows of one
    ``placement`` only (a link across hosts is another link than loopback) and one rank count.

    Ranks that outnumber the host's cores make another link too: on 2 cores MLX's ring at 4 ranks fitted
    alpha 5.0 ms per ring step against 39 us at 2 (its ranks poll their sockets, so each hop waits for a
    core), and one fit over both priced the 4-rank steps 2-19x under their measure.

    Args:
        num_ranks: Fit the rows of this rank count only; needed when ``table`` holds several.
        statistic: ``"median"`` (``time_s``: a typical call) or ``"mean"`` (``mean_s``: what many calls cost
            together where some stall; XLA's gloo all-reduce on 2 cores with 2 ranks took 0.2 ms or, in 24-68% of
            calls, a scheduler slice of about 4 ms, and every call 4.0 ms with each rank pinned to one core).

    Raises:
        ValueError: naming the framework and kind whose times do not grow with size, the rank counts a
            table mixes when ``num_ranks`` is not given, or an unknown ``statistic``.
    """
    if statistic not in LINK_STATISTICS:
        raise ValueError(f"statistic={statistic!r}: one of {', '.join(LINK_STATISTICS)}")
    fits = {}
    if "placement" in table:
        table = table[table.placement == placement]
    if num_ranks is not None:
        table = table[table.num_ranks == num_ranks]
    elif "num_ranks" in table and table.num_ranks.nunique() > 1:
        raise ValueError(f"the benchmarks hold {sorted(int(n) for n in table.num_ranks.unique())} ranks: a link is fitted "
                         "at one rank count (num_ranks=), as a placement of more ranks than cores is another link")
    for (framework, kind), g in table.groupby(["framework", "kind"], sort=True):
        g = g.sort_values("rank_bytes", kind="stable")
        sizes, times, steps = g.rank_bytes.to_numpy(), g[LINK_STATISTICS[statistic]].to_numpy(), g.num_steps.to_numpy()
        try:
            fits[(framework, kind)] = fit_alpha_beta(sizes, times, steps, relative=True)
            continue
        except ValueError as err:
            problem = f"{framework} {kind}: {err} (too few or too noisy sizes: measure larger messages)"
        envelope = lower_envelope(times)  # stalls: a collective of more bytes takes no less time than a smaller one
        if not envelope[-1] > envelope[0]:
            raise ValueError(problem)
        try:
            fits[(framework, kind)] = fit_alpha_beta(sizes, envelope, steps, relative=True)
        except ValueError:
            raise ValueError(problem) from None
    return fits


def lower_envelope(times_s) -> np.ndarray:
    """Each time of a sweep sorted by size replaced by the least time of it and every larger size: what the
    collective costs without the scheduler's stalls, where a loaded machine made a small size's median slower than
    a larger size's so that the relative fit's bandwidth came out negative (once in CI: MLX's all-gather on 2 cores
    under three test workers, measured three times with larger sizes each time). Used only where the times as
    measured cannot be fitted."""
    return np.minimum.accumulate(np.asarray(times_s, float)[::-1])[::-1]

"""The bucket-size advisor against a measured ``communication_size`` sweep (notebook 05, the deck).

:func:`workbench.estimate.advisor.recommend_communication_size` prices each candidate size with the
machine's fitted alpha-beta links and recommends the smallest size within ``tolerance`` of the least
predicted sync time. :func:`advice_against_sweep` asks it about exactly the sizes a stored sweep ran,
for the sweep's own model, N and layout, and sets the measured step time of each size beside the
prediction: did the advised size run within 5% of the best size measured? :func:`fig_bucket_advice`
draws it. The predicted *step* time is the predicted sync time plus one constant, the median over the
sweep of (measured step - predicted sync): the part of the step the links do not see (gradient,
update, dispatch). The advice itself does not depend on that constant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import pandas as pd
import plotly.graph_objects as go

from workbench.estimate.advisor import ADVISED_STRATEGIES, BucketAdvice, fit_bucket_costs, recommend_communication_size
from workbench.estimate.comm import AlphaBeta
from workbench.runs.estimate import run_model_spec, spec_from_row
from workbench.studies.step_time import comm_size_table
from workbench.views.style import TEMPLATE

#: The advised size must run within this fraction of the best measured (issue 17).
ADVICE_TARGET = 0.05

#: Columns of :attr:`AdviceCheck.table`, as a reader sees them.
ADVICE_COLUMNS = ["communication size (MiB)", "buckets", "predicted sync (ms)", "predicted step (ms)",
                  "measured step (ms)", "measured p25 (ms)", "measured p75 (ms)", "advised", "best measured"]


@dataclass(frozen=True)
class AdviceCheck:
    """The advisor's pick for a stored sweep, against what the sweep measured.

    Attributes:
        advice: The advisor's answer (recommendation and predicted curve).
        table: One row per size of the sweep (:data:`ADVICE_COLUMNS`).
        best_measured: The size (bytes) with the least measured step time.
        gap: Measured step at the advised size over the best measured, minus 1 (0.03 = 3% slower).
        label: What was swept: framework, strategy, precision, model size, N.
        per_bucket_s: Seconds each bucket cost beyond its links, fitted to the sweep with ``base_s``
            (:func:`~workbench.estimate.advisor.fit_bucket_costs`; 0 where the steps do not grow with the buckets).
        base_s: Seconds of a step that do not depend on the buckets, fitted with ``per_bucket_s``.
    """

    advice: BucketAdvice
    table: pd.DataFrame
    best_measured: int
    gap: float
    label: str
    per_bucket_s: float = 0.0
    base_s: float = 0.0

    @property
    def spread_ms(self) -> float:
        """The runs' own spread: the median over sizes of each size's interquartile range of step times (after
        warm-up, slowest rank per step), in ms."""
        t = self.table
        return float((t["measured p75 (ms)"] - t["measured p25 (ms)"]).median())

    def _two_fastest(self) -> tuple[tuple[float, float], tuple[float, float]]:
        """(size MiB, median ms) of the fastest and the second fastest size measured."""
        t = self.table.sort_values("measured step (ms)")
        return tuple((float(r["communication size (MiB)"]), float(r["measured step (ms)"]))
                     for _, r in t.head(2).iterrows())

    @property
    def reliable(self) -> bool:
        """Whether the fastest size's median step beats the second fastest's by more than the runs' own spread:
        if not, the sweep cannot tell them apart, and the best measured size (so the gap to it) means no more."""
        (_, best), (_, second) = self._two_fastest()
        return second - best > self.spread_ms

    def verdict(self) -> str:
        """The pick said with its evidence: reliable, or "no reliable pick" when the spread hides the difference."""
        (a, best), (b, second) = self._two_fastest()
        said = (f"{a:g} MiB and {b:g} MiB, the fastest two, differ by {second - best:.3g} ms; the runs' spread is "
                f"{self.spread_ms:.3g} ms (interquartile range over steps)")
        return said + (": a reliable pick" if self.reliable else ": no reliable pick between them")

    @property
    def within_target(self) -> bool:
        """Whether the advised size ran within :data:`ADVICE_TARGET` of the best measured."""
        return self.gap <= ADVICE_TARGET

    def summary(self) -> pd.DataFrame:
        """The answer in words and rounded figures (what a notebook or slide prints). When the predicted
        sync varies by less across the sizes than the measured steps do, the sizes are a tie within
        this machine's noise, and the gap says so much and no more."""
        mib, t = 2**20, self.table
        sync, step = t["predicted sync (ms)"], t["measured step (ms)"]
        spread = sync.max() - sync.min()
        return pd.DataFrame({"answer": {
            "swept": self.label,
            "predicted sync, largest - smallest over the sizes": f"{spread:.1f} ms ({spread / step.median():.1%} of a step)",
            "measured step, slowest / fastest size": f"{step.max() / step.min():.2f}",
            "cost per bucket beyond the links (fitted)": f"{self.per_bucket_s * 1e3:.2f} ms",
            "advised communication_size": f"{self.advice.communication_size / mib:g} MiB",
            "best measured": f"{self.best_measured / mib:g} MiB",
            "advised against best measured": f"{self.gap * 100:+.1f}%",
            f"within {ADVICE_TARGET:.0%} of the best measured": "yes" if self.within_target else "no",
            "steps' spread (median interquartile range)": f"{self.spread_ms:.1f} ms",
            "pick": "reliable" if self.reliable else "no reliable pick: the runs' spread hides the difference",
        }})

def advice_against_sweep(loaded, links: Mapping[tuple[str, str], AlphaBeta], *, framework: str = "mlx",
                         strategy: str = "fsdp-row", precision: str = "float32", tolerance: float = 0.01) -> AdviceCheck:
    """Recommend a ``communication_size`` among the sizes a stored sweep ran, and check it against them.

    Args:
        loaded: :func:`workbench.runs.tables.load_runs` of the sweep's store.
        links: :func:`workbench.studies.step_time.fit_links` of the same machine's collective benchmark.
        framework, strategy, precision: Which runs of the store form the sweep (one model, one N).
        tolerance: The advisor's knee (see :func:`~workbench.estimate.advisor.recommend_communication_size`).

    Raises:
        ValueError: fewer than 2 sizes measured, runs of several models or group sizes mixed, or a
            strategy the advisor does not price, each named.
    """
    if strategy not in ADVISED_STRATEGIES:
        raise ValueError(f"strategy {strategy!r}: the advisor prices {', '.join(ADVISED_STRATEGIES)}.")
    table = comm_size_table(loaded, links)
    t = table[(table.framework == framework) & (table.strategy == strategy) & (table.precision == precision)]
    t = t.dropna(subset=["step_ms"])
    if t.communication_size.nunique() < 2:
        raise ValueError(f"advice_against_sweep: {framework} {strategy} {precision} has "
                         f"{t.communication_size.nunique()} communication_size(s) measured; a sweep needs at least 2.")
    runs = loaded.runs.set_index("run_id").loc[t.run_id]
    specs = [spec_from_row(row) for _, row in runs.reset_index().iterrows()]
    shapes = {(repr(s["model"]), s["num_ranks"]) for s in specs}
    if len(shapes) > 1:
        raise ValueError(f"advice_against_sweep: the {framework} {strategy} runs mix {len(shapes)} (model, num_ranks) "
                         "pairs; keep one sweep per store (or filter the runs first).")
    measured = t.groupby("communication_size").step_ms.median()
    low, high = (t.groupby("communication_size")[c].median() for c in ("step_p25_ms", "step_p75_ms"))
    sizes = [int(s) for s in measured.index]
    spec, n = run_model_spec(specs[0]), int(specs[0]["num_ranks"])
    kw = dict(sizes=sizes, strategy=strategy, framework=framework)
    bare = recommend_communication_size(spec, n, links, tolerance=tolerance, **kw)
    # what the links leave of each size's step: a constant and a cost per bucket (packing, dispatch), fitted
    base_s, per_bucket_s = fit_bucket_costs([p.num_buckets for p in bare.curve],
                                            [measured[p.communication_size] / 1e3 - p.predicted_sync_s for p in bare.curve])
    advice = recommend_communication_size(spec, n, links, tolerance=tolerance, base_s=base_s, per_bucket_s=per_bucket_s,
                                          **kw)
    best = int(measured.idxmin())
    rows = [[p.communication_size / 2**20, p.num_buckets, p.predicted_sync_s * 1e3, p.predicted_step_s * 1e3,
             float(measured[p.communication_size]), float(low[p.communication_size]), float(high[p.communication_size]),
             p.communication_size == advice.communication_size,
             p.communication_size == best] for p in advice.curve]
    return AdviceCheck(advice=advice, table=pd.DataFrame(rows, columns=ADVICE_COLUMNS), best_measured=best,
                       gap=float(measured[advice.communication_size] / measured[best] - 1),
                       label=f"{framework} {strategy} {precision}, {spec.num_params / 1e6:.1f}M parameters, N = {n}",
                       per_bucket_s=per_bucket_s, base_s=base_s)


def fig_bucket_advice(check: AdviceCheck, *, height: int = 440) -> go.Figure:
    """Predicted and measured step time against ``communication_size``; the advised and best sizes marked."""
    t = check.table
    x = t["communication size (MiB)"].tolist()
    step = t["measured step (ms)"]
    # The y axis is zoomed to the data: the subtitle says by how much the sizes differ at all.
    title = (f"Bucket-size advice: {check.label}<br><sup>y axis zoomed: the slowest size ran "
             f"{step.max() / step.min():.2f}x the fastest<br>{check.verdict()}</sup>")
    fig = go.Figure(layout=dict(template=TEMPLATE, height=height, title=title, margin_t=110,
                                xaxis=dict(type="log", title="communication_size (MiB, log scale)", tickvals=x,
                                           ticktext=[f"{v:g}" for v in x]),
                                yaxis=dict(title="time per step (ms)"), margin=dict(b=100),
                                legend=dict(orientation="h", yref="container", y=0, yanchor="bottom")))  # under the x title
    fig.add_trace(go.Scatter(x=x, y=step.tolist(), mode="lines+markers", name="measured step (median, quartiles)",
                             line=dict(color="#4C78A8"),
                             error_y=dict(type="data", symmetric=False, array=(t["measured p75 (ms)"] - step).tolist(),
                                          arrayminus=(step - t["measured p25 (ms)"]).tolist(), thickness=1.2)))
    fig.add_trace(go.Scatter(x=x, y=t["predicted step (ms)"].tolist(), mode="lines+markers",
                             name="predicted step (links + per bucket + constant)", line=dict(color="#F58518", dash="dash")))
    for flag, label, color, symbol in (("advised", "advised", "#E45756", "star"),
                                       ("best measured", "best measured", "#54A24B", "circle-open")):
        row = t[t[flag]].iloc[0]
        fig.add_trace(go.Scatter(x=[row["communication size (MiB)"]], y=[row["measured step (ms)"]], mode="markers",
                                 name=f"{label}: {row['communication size (MiB)']:g} MiB",
                                 marker=dict(color=color, size=16, symbol=symbol, line=dict(width=2, color=color))))
    return fig

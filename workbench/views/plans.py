"""Figures of bucket and shard plans.

Every ``fig_*`` function returns a :class:`plotly.graph_objects.Figure` and never
shows it. Figures only aggregate what the planners computed (sums, bin means,
cumulative offsets for drawing); every number they show can be reproduced by
calling :func:`workbench.core.buckets.plan_buckets` or :func:`workbench.core.shards.plan_shards`.

Figures stay small and fast on large plans (Llama-3-70B has 723 arrays; N may be
1024): one bar trace per colour group with ``base=`` for stacked segments, never
one trace per parameter; a shard map (:mod:`workbench.views.shard_map`) shows at most its ``MAX_RANKS_SHOWN`` ranks
(the first and last halves) and a rank-load figure at most ``MAX_RANK_BINS``
bins. Titles say when either kicks in. Sizes on axes are MiB (2**20 bytes).
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from workbench.core.buckets import BucketPlan, plan_buckets
from workbench.core.shards import ShardPlan, plan_shards
from workbench.core.param_kinds import PARAM_KINDS, param_kind
from workbench.core.specs import ModelSpec
from workbench.core.units import MiB, format_bytes, plural
from workbench.views.style import (
    KIND_COLORS,
    LAYOUT_COLORS,
    SERIES_COLORS,
    coincide,
    figure,
    path_span,
    subplot_grid,
)

#: Segments in a bucket-layout figure; beyond this, same-kind runs and then whole buckets merge.
MAX_BUCKET_SEGMENTS = 4000

#: Width of a bucket's bar in bucket slots: bar ``i`` spans ``[i - 0.4, i + 0.4]``.
BUCKET_BAR_WIDTH = 0.8


# --------------------------------------------------------------------------- buckets


def _bucket_segments(bucket_plan: BucketPlan) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str]:
    """Segments to stack per bucket: (first array, end array, bytes, kind index) in plan order, and the level.

    Level ``"array"`` draws one segment per array; past :data:`MAX_BUCKET_SEGMENTS`
    runs of same-kind arrays merge (``"kind run"``), then whole buckets (``"bucket"``,
    coloured by the kind of their largest array).
    """
    bp, spec = bucket_plan, bucket_plan.spec
    array_bytes = (spec.sizes * spec.itemsizes)[bp.order]
    kinds = np.array([PARAM_KINDS.index(param_kind(spec.params[i].path)) for i in bp.order], np.int64)
    bucket = np.repeat(np.arange(bp.num_buckets), np.diff(bp.offsets))
    starts, level = np.arange(len(bp.order)), "array"
    if len(starts) > MAX_BUCKET_SEGMENTS:
        new_run = np.ones(len(starts), bool)
        new_run[1:] = (bucket[1:] != bucket[:-1]) | (kinds[1:] != kinds[:-1])
        starts, level = np.flatnonzero(new_run), "kind run"
    if len(starts) > MAX_BUCKET_SEGMENTS:
        starts, level = bp.offsets[:-1], "bucket"
        largest = np.maximum.reduceat(array_bytes, starts)
        is_largest = np.flatnonzero(array_bytes == largest[bucket])
        _, first = np.unique(bucket[is_largest], return_index=True)
        seg_kinds = kinds[is_largest[first]]
    else:
        seg_kinds = kinds[starts]
    stops = np.append(starts[1:], len(bp.order))
    return starts, stops, np.add.reduceat(array_bytes, starts), seg_kinds, level


def fig_bucket_layout(bucket_plan: BucketPlan, *, height: int = 420) -> go.Figure:
    """Buckets as stacked bars of their parameters, one slot per bucket.

    Each bucket is one bar of fixed width :data:`BUCKET_BAR_WIDTH` centred on its index, so it
    spans ``[i - 0.4, i + 0.4]`` whatever its size: the width means "one bucket" (one
    collective) and only the height means bytes (MiB), made of one segment per parameter
    coloured by :func:`param_kind` (hover: path, shape, size). The ``communication_size`` cap is
    a dashed line trace in the legend (named ``"communication_size"``, omitted when the cap is
    ``<= 0``); a last bucket below the cap is marked by a ``"tail"`` marker above it, also in
    the legend, so no label sits on the bars.

    Args:
        bucket_plan: From :func:`workbench.core.buckets.plan_buckets`.
        height: Figure height in pixels.
    """
    bp, spec = bucket_plan, bucket_plan.spec
    cap, num_b = bp.communication_size, bp.num_buckets
    starts, stops, seg_bytes, seg_kinds, level = _bucket_segments(bp)
    seg_bucket = np.repeat(np.arange(num_b), np.diff(bp.offsets))[starts]
    csum = np.cumsum(seg_bytes) - seg_bytes
    seg_base = csum - csum[np.searchsorted(seg_bucket, seg_bucket)]
    params = spec.params
    if level == "array":
        custom = [(params[i].path, str(params[i].shape), format_bytes(b)) for i, b in zip(bp.order[starts], seg_bytes)]
        hover = "bucket %{x}<br>%{customdata[0]}<br>shape %{customdata[1]}<br>%{customdata[2]}"
    else:
        custom = [(path_span([params[i].path for i in bp.order[a:z]]),) for a, z in zip(starts, stops)]
        hover = "bucket %{x}<br>%{customdata[0]}<br>%{y:.3f} MiB"
    custom = np.array(custom, dtype=object).reshape(len(custom), -1)
    traces = []
    for k, kind in enumerate(PARAM_KINDS):
        mask = seg_kinds == k
        if mask.any():
            # An explicit width: plotly otherwise takes a trace's bar width from the gaps between
            # its own x values, so a kind present in buckets 0 and 161 only drew 137 slots wide.
            traces.append(dict(
                type="bar", x=seg_bucket[mask], y=seg_bytes[mask] / MiB, base=seg_base[mask] / MiB, name=kind,
                width=BUCKET_BAR_WIDTH, marker=dict(color=KIND_COLORS[kind], line=dict(width=0)),
                customdata=custom[mask], hovertemplate=f"{hover}<extra>{kind}</extra>",
            ))
    tail_text = ""
    if cap > 0:
        traces.append(dict(type="scatter", x=[-0.5, max(num_b, 1) - 0.5], y=[cap / MiB] * 2, mode="lines",
                           name=f"communication_size = {format_bytes(cap)}", legendgroup="communication_size",
                           line=dict(color="#333333", width=1.5, dash="dash"), hoverinfo="skip",
                           legendrank=2000))
        if num_b and bp.bucket_bytes[-1] < cap:
            tail_text = f"; tail (last bucket) {format_bytes(bp.bucket_bytes[-1])}"
            top = float(bp.bucket_bytes.max()) / MiB
            traces.append(dict(type="scatter", x=[num_b - 1], y=[bp.bucket_bytes[-1] / MiB + 0.04 * top],
                               mode="markers", name="tail: last bucket, below the cap",
                               marker=dict(symbol="triangle-down", size=10, color="#B00020"),
                               customdata=[format_bytes(bp.bucket_bytes[-1])], legendrank=2001,
                               hovertemplate="tail: bucket %{x}, %{customdata}<extra></extra>"))
    if cap > 0:
        first = bp.policy.first_bucket_bytes
        cap_text = (f"{format_bytes(cap)}" + (f", first bucket of each dtype {format_bytes(first)}" if first else "")
                    + f" (buckets below it: {bp.num_under_threshold}{tail_text})")
    else:
        cap_text = "0 (one bucket per array)"
    merged = "" if level == "array" else f"; segments are merged {level}s"
    title = (f"{spec.name}: {num_b} buckets = {bp.num_allreduces_per_step} all-reduces per DDP step "
             f"(policy {bp.policy.name})<br><sup>communication_size {cap_text}<br>{plural(len(spec), 'array')}, "
             f"{format_bytes(spec.nbytes)}{merged}</sup>")
    layout = dict(barmode="overlay", margin=dict(l=60, r=20, t=95, b=60),
                  xaxis=dict(title=dict(text="bucket index (one bar per bucket; bar width carries no size)"),
                             range=[-0.5, max(num_b, 1) - 0.5], tickformat="d"),
                  yaxis=dict(title=dict(text="bytes in the bucket (MiB)"), rangemode="tozero", ticklabelstandoff=6))
    return figure(traces, layout, title, height)


# --------------------------------------------------------------------------- shards


def _collectives(p: ShardPlan) -> str:
    parts = [f"{num} {kind}" for num, kind in ((p.num_reduce_scatters, "RS"), (p.num_all_gathers, "AG"),
                                               (p.num_all_reduces, "AR"), (p.num_broadcasts, "bcast")) if num]
    return " + ".join(parts)


#: What the "of which" cells abbreviate; the table's subtitle says it. (One-line cells: plotly places a
#: multi-line cell's text from measured line heights, which a hidden slide or unattached widget reads as 0.)
COLLECTIVE_ABBREVIATIONS = "RS = reduce-scatter, AG = all-gather, AR = all-reduce, bcast = broadcast"


#: Columns of :func:`fig_layout_metrics`: header (full words, units; ``<br>`` breaks lines), and the cell
#: text from ``(summary, plan)``. Sizes carry their unit in the cell ("14.83 MiB").
METRIC_COLUMNS = (
    ("ranks<br>(N)", lambda s, p: str(s["num_shards"])),
    ("buckets", lambda s, p: str(s["num_buckets"])),
    ("bytes<br>per rank,<br>maximum", lambda s, p: format_bytes(s["max_rank_bytes"])),
    ("bytes<br>per rank,<br>mean", lambda s, p: format_bytes(s["mean_rank_bytes"])),
    ("imbalance<br>(maximum<br>/ mean)", lambda s, p: f"{s['imbalance']:.3f}"),
    ("padding,<br>all ranks<br>(bytes)", lambda s, p: format_bytes(s["padding_bytes"])),
    ("arrays<br>split across<br>ranks", lambda s, p: str(s["num_split_arrays"])),
    ("fragments<br>per rank,<br>maximum", lambda s, p: str(s["max_fragments_per_rank"])),
    ("fragments<br>per rank,<br>mean", lambda s, p: f"{s['mean_fragments_per_rank']:.1f}"),
    ("collectives<br>per step", lambda s, p: str(s["num_collectives_per_step"])),
    ("of which", lambda s, p: _collectives(p)),
)

#: Table geometry in pixels: a generous character width of the 12 px font, cell padding, line height.
_CHAR_PX, _PAD_PX, _LINE_PX = 6.4, 14, 17


def fig_layout_metrics(plans: Mapping[str, ShardPlan], *, height: int | None = None) -> go.Figure:
    """A table comparing layouts, one row per plan, from :meth:`ShardPlan.summary` (columns: :data:`METRIC_COLUMNS`).

    The table is sized to its content: each column as wide as its longest line, every row as tall
    as its lines, and the figure's width and height their sum, so no header is cut and no row is
    hidden. Text never wraps on its own (spaces are non-breaking; plotly's own wrapping measured
    text before the widget was on screen and drew every cell with a space blank).
    """
    if not plans:
        raise ValueError("fig_layout_metrics needs at least one plan.")
    nbsp = lambda text: text.replace(" ", "\u00a0")  # noqa: E731
    header = ["layout"] + [name for name, _ in METRIC_COLUMNS]
    rows = [[label] + [cell(plan.summary(), plan) for _, cell in METRIC_COLUMNS] for label, plan in plans.items()]
    columns = [list(col) for col in zip(header, *rows)]
    widths = [_PAD_PX + _CHAR_PX * max(len(line) for text in col for line in text.split("<br>")) for col in columns]
    header_h = 8 + _LINE_PX * max(len(h.split("<br>")) for h in header)
    row_h = [8 + _LINE_PX * max(len(c.split("<br>")) for c in row) for row in rows]
    table = dict(
        type="table", columnwidth=widths,
        header=dict(values=[nbsp(h) for h in header], fill=dict(color="#E8EEF5"), align="left", height=header_h),
        cells=dict(values=[[nbsp(c) for c in col[1:]] for col in columns], align="left", height=max(row_h)),
    )
    bp = next(iter(plans.values())).buckets
    title = (f"Layouts compared: {bp.spec.name}, {bp.num_buckets} buckets (policy {bp.policy.name})"
             f"<br><sup>collectives: {COLLECTIVE_ABBREVIATIONS}</sup>")
    margin = dict(l=10, r=10, t=64, b=10)
    width = int(sum(widths)) + margin["l"] + margin["r"] + 4
    content_h = margin["t"] + header_h + max(row_h) * len(rows) + margin["b"] + 12
    return figure([table], dict(margin=margin, width=width, autosize=False), title, height or content_h)


# --------------------------------------------------------------------------- sweeps


def fig_buckets_vs_size(spec: ModelSpec, sizes_bytes: Iterable[int], policies: Sequence[str] = ("mlx", "pytorch-ddp"),
                        *, height: int = 380) -> go.Figure:
    """Bucket count (= all-reduces per DDP step) and largest bucket against ``communication_size``.

    Args:
        spec: The model.
        sizes_bytes: Caps to plan with, in bytes, all ``> 0`` (the x axis is log).
        policies: Bucket policy names (or :class:`~workbench.core.buckets.BucketPolicy`), one line each.
        height: Figure height in pixels.

    Raises:
        ValueError: on an empty or non-positive ``sizes_bytes``.
    """
    sizes = np.unique(np.asarray(list(sizes_bytes), dtype=np.int64))
    if not len(sizes) or sizes[0] <= 0:
        raise ValueError(f"sizes_bytes must be non-empty and all > 0 for a log axis, got {sizes.tolist()}.")
    layout, ((x1, y1), (x2, y2)) = subplot_grid(1, 2, ("buckets = all-reduces per DDP step", "largest bucket (MiB)"))
    labels = [format_bytes(s) for s in sizes]
    traces, drawn = [], {}
    for k, policy in enumerate(policies):
        bucket_plans = [plan_buckets(spec, int(s), policy=policy) for s in sizes]
        name = bucket_plans[0].policy.name
        counts = tuple(p.num_buckets for p in bucket_plans)
        largest = tuple(float(p.bucket_bytes.max()) / MiB for p in bucket_plans)
        same = [other for other, seen in drawn.items() if seen[0] == counts or coincide(seen[1], largest, rtol=0.1)]
        drawn[name] = (counts, largest)
        label = f"{name} (dashed, over {same[0]})" if same else name
        # Each policy its own dash and marker, so a line drawn on top of another leaves the first visible.
        common = dict(type="scatter", x=sizes / MiB, mode="lines+markers", name=label, legendgroup=name,
                      customdata=labels, line=dict(color=SERIES_COLORS[k % len(SERIES_COLORS)], dash=_DASHES[k % 4],
                                                   width=2 + 2 * (len(policies) - 1 - k)),
                      marker=dict(symbol=_SYMBOLS[k % 4], size=12 - 4 * k if k < 2 else 6))
        traces.append(dict(common, y=list(counts), xaxis=x1, yaxis=y1,
                           hovertemplate=f"cap %{{customdata}}<br>%{{y}} buckets<extra>{name}</extra>"))
        traces.append(dict(common, y=list(largest), xaxis=x2, yaxis=y2, showlegend=False,
                           hovertemplate=f"cap %{{customdata}}<br>largest %{{y:.2f}} MiB<extra>{name}</extra>"))
    traces.append(dict(type="scatter", x=sizes / MiB, y=sizes / MiB, mode="lines", name="largest = cap", xaxis=x2,
                       yaxis=y2, line=dict(color="#999999", dash="dot"), hoverinfo="skip"))
    for axis, values in (("xaxis", sizes / MiB), ("xaxis2", sizes / MiB),
                         ("yaxis", [c for c, _ in drawn.values()]),
                         ("yaxis2", [*(big for _, big in drawn.values()), sizes / MiB])):
        layout[axis].update(_decades(np.concatenate([np.ravel(v) for v in values])))
    for axis in ("xaxis", "xaxis2"):
        layout[axis].update(title=dict(text="communication_size (MiB)"))
    notes = []
    for what, k in (("bucket counts", 0), ("largest buckets", 1)):
        first, *rest = list(drawn.items()) or [("", ((), ()))]
        same = [name for name, seen in rest if coincide(seen[k], first[1][k], rtol=0 if k == 0 else 0.1)]
        if same:
            exact = all(seen[k] == first[1][k] for name, seen in rest if name in same)
            notes.append(f"{what} of {first[0]} and {', '.join(same)} {'coincide' if exact else 'nearly coincide'}")
    note = "<br>" + "; ".join(notes) + " (dashed drawn over solid)" if notes else ""
    title = (f"{spec.name}: buckets vs communication_size<br><sup>{plural(len(spec), 'array')}, {format_bytes(spec.nbytes)}"
             f"{note}</sup>")
    # The note's line adds height, not takes it from the plot; the legend clears the axis titles (it lay on them).
    layout.update(margin=dict(l=60, r=20, t=100 if notes else 80, b=80), legend=dict(orientation="h", yanchor="top", y=-0.26, x=0))
    return figure(traces, layout, title, height + (20 if notes else 0) + 20)


_DASHES, _SYMBOLS = ("solid", "dash", "dot", "dashdot"), ("circle", "x-thin-open", "square-open", "diamond-open")


def _decades(values: np.ndarray) -> dict:
    """A log axis with a labelled tick at each power of ten only, spanning whole decades around ``values``.

    Plotly's own log ticks labelled the minor 2s and 5s too ("2, 100, 9...2"), and a range inside one
    decade drew no power of ten at all.
    """
    values = values[values > 0]
    lo, hi = np.log10(values.min()) - 0.12, np.log10(values.max()) + 0.12
    if int(np.floor(hi)) - int(np.ceil(lo)) < 1:  # fewer than two powers of ten inside: widen to whole decades
        lo, hi = np.floor(lo), max(np.ceil(hi), np.floor(lo) + 1)
    ticks = [10.0**e for e in range(int(np.ceil(lo)), int(np.floor(hi)) + 1)]
    return dict(type="log", range=[float(lo), float(hi)], tickvals=ticks, ticktext=[f"{t:g}" for t in ticks])


def fig_padding_vs_shards(bucket_plan: BucketPlan, num_shards_list: Iterable[int], *, height: int = 380) -> go.Figure:
    """Padding bytes (all ranks) and max fragments per rank against N, for row (``pad_rows=True``) and flat.

    Args:
        bucket_plan: From :func:`workbench.core.buckets.plan_buckets`.
        num_shards_list: Values of N (each >= 1).
        height: Figure height in pixels.

    Raises:
        ValueError: on an empty list, or what :func:`~workbench.core.shards.plan_shards` raises.
    """
    ns = np.unique(np.asarray(list(num_shards_list), dtype=np.int64))
    if not len(ns):
        raise ValueError("num_shards_list must not be empty.")
    layout, ((x1, y1), (x2, y2)) = subplot_grid(1, 2, ("padding, all ranks (MiB)", "max fragments per rank"))
    traces = []
    for name, label, kwargs in (("row", "row (pad_rows)", dict(pad_rows=True)), ("flat", "flat", {})):
        shard_plans = [plan_shards(bucket_plan, int(n), name, **kwargs) for n in ns]
        common = dict(type="scatter", x=ns, mode="lines+markers", name=label, legendgroup=name,
                      line=dict(color=LAYOUT_COLORS[name]))
        traces.append(dict(common, y=[p.padding_bytes / MiB for p in shard_plans], xaxis=x1, yaxis=y1,
                           customdata=[format_bytes(p.padding_bytes) for p in shard_plans],
                           hovertemplate=f"N=%{{x}}<br>padding %{{customdata}}<extra>{label}</extra>"))
        traces.append(dict(common, y=[int(p.rank_fragments.max()) for p in shard_plans], xaxis=x2, yaxis=y2,
                           showlegend=False, hovertemplate=f"N=%{{x}}<br>%{{y}} fragments<extra>{label}</extra>"))
    for axis in ("xaxis", "xaxis2"):
        layout[axis].update(type="log", title=dict(text="N (ranks)"), tickvals=ns.tolist(), ticktext=[str(n) for n in ns])
    bp = bucket_plan
    title = (f"{bp.spec.name}: padding and fragmentation vs N<br><sup>{bp.num_buckets} buckets, "
             f"communication_size {format_bytes(bp.communication_size)}, policy {bp.policy.name}</sup>")
    return figure(traces, layout, title, height)

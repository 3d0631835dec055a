"""Figures of bucket and shard plans.

Every ``fig_*`` function returns a :class:`plotly.graph_objects.Figure` and never
shows it. Figures only aggregate what the planners computed (sums, bin means,
cumulative offsets for drawing); every number they show can be reproduced by
calling :func:`workbench.buckets.plan_buckets` or :func:`workbench.shards.plan_shards`.

Figures stay small and fast on large plans (Llama-3-70B has 723 arrays; N may be
1024): one bar trace per colour group with ``base=`` for stacked segments, never
one trace per parameter; a shard map shows at most :data:`MAX_RANKS_SHOWN` ranks
(the first and last halves) and a rank-load figure at most :data:`MAX_RANK_BINS`
bins. Titles say when either kicks in. Sizes on axes are MiB (2**20 bytes).
"""

from __future__ import annotations

import functools
import re
from typing import Iterable, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .buckets import BucketPlan, plan_buckets
from .shards import ShardPlan, plan_shards
from .specs import ModelSpec
from .units import MiB, format_bytes

TEMPLATE = "plotly_white"
#: Colour of each parameter kind (see :func:`param_kind`); ``"mixed"`` marks merged segments.
KIND_COLORS = {
    "embedding": "#4C78A8", "attention": "#F58518", "mlp": "#54A24B",
    "expert": "#B279A2", "norm": "#E45756", "other": "#9D755D", "mixed": "#72B7B2",
}
#: Colours cycled over the arrays of a bucket in a shard map.
PARAM_COLORS = ("#4C78A8", "#F58518", "#54A24B", "#B279A2", "#E45756", "#72B7B2", "#EECA3B", "#FF9DA6", "#9D755D")
PADDING_COLOR = "#C8C8C8"
LAYOUT_COLORS = {"row": "#4C78A8", "flat": "#F58518", "greedy": "#54A24B"}
SERIES_COLORS = ("#4C78A8", "#F58518", "#54A24B", "#B279A2", "#E45756")
#: Ranks drawn in a shard map; beyond this, the first and last half of it.
MAX_RANKS_SHOWN = 16
#: Rank bins in a rank-load figure; beyond this, ranks are binned.
MAX_RANK_BINS = 64
#: Segments in a bucket-layout figure; beyond this, same-kind runs and then whole buckets merge.
MAX_BUCKET_SEGMENTS = 4000
#: Arrays drawn per rank in a shard map; beyond this, consecutive arrays merge into groups.
MAX_SEGMENTS_PER_RANK = 256

_KIND_RULES = (
    ("expert", re.compile(r"(^|\.)experts?\.")),
    ("norm", re.compile(r"norm|(^|\.)ln_")),
    ("embedding", re.compile(r"embed|(^|\.)(wte|wpe)\.|lm_head")),
    ("attention", re.compile(r"attn|attention|(^|\.)[qkvo]_proj\.|(^|\.)w[qkvo]\.")),
    ("mlp", re.compile(r"mlp|feed_forward|ffn|moe|(^|\.)(gate|up|down)_proj\.|(^|\.)(w[123]|c_fc|c_proj)\.")),
)
_KINDS = tuple(KIND_COLORS)


@functools.lru_cache(maxsize=1 << 16)
def param_kind(path: str) -> str:
    """The kind of a parameter from its path: embedding, attention, mlp, expert, norm or other.

    Routed experts win over everything (``...experts.3.w1.weight`` is ``"expert"``);
    norms win over their block (``self_attn.q_norm.weight`` is ``"norm"``).
    """
    lowered = path.lower()
    for kind, pattern in _KIND_RULES:
        if pattern.search(lowered):
            return kind
    return "other"


def _layout(fig: go.Figure, title: str, height: int, **kwargs) -> go.Figure:
    fig.update_layout(
        template=TEMPLATE, title=dict(text=title, x=0.01, xanchor="left", font_size=14), height=height,
        margin=dict(l=60, r=20, t=80, b=50), legend=dict(orientation="h", y=-0.18, x=0), **kwargs,
    )
    return fig


def _span(paths: Sequence[str]) -> str:
    return paths[0] if len(paths) == 1 else f"{len(paths)} arrays: {paths[0]} … {paths[-1]}"


def _shown_ranks(num_shards: int) -> np.ndarray:
    if num_shards <= MAX_RANKS_SHOWN:
        return np.arange(num_shards)
    half = MAX_RANKS_SHOWN // 2
    return np.concatenate([np.arange(half), np.arange(num_shards - half, num_shards)])


def _rank_edges(num_shards: int) -> np.ndarray:
    """Bin edges over ranks: one bin per rank up to :data:`MAX_RANK_BINS`, else that many equal bins."""
    num_bins = min(num_shards, MAX_RANK_BINS)
    return np.unique(np.linspace(0, num_shards, num_bins + 1).round().astype(np.int64))


# --------------------------------------------------------------------------- buckets


def _bucket_segments(bucket_plan: BucketPlan) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str]:
    """Segments to stack per bucket: (first array, end array, bytes, kind index) in plan order, and the level.

    Level ``"array"`` draws one segment per array; past :data:`MAX_BUCKET_SEGMENTS`
    runs of same-kind arrays merge (``"kind run"``), then whole buckets (``"bucket"``,
    coloured by the kind of their largest array).
    """
    bp, spec = bucket_plan, bucket_plan.spec
    array_bytes = (spec.sizes * spec.itemsizes)[bp.order]
    kinds = np.array([_KINDS.index(param_kind(spec.params[i].path)) for i in bp.order], np.int64)
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
    """Buckets as stacked bars of their parameters.

    x is the bucket index, y the bucket's size in MiB, made of one segment per
    parameter coloured by :func:`param_kind` (hover: path, shape, MiB). The
    ``communication_size`` cap is a dashed line (shape named ``"communication_size"``,
    omitted when the cap is ``<= 0``); a last bucket below the cap is marked by an
    annotation named ``"tail"``.

    Args:
        bucket_plan: From :func:`workbench.buckets.plan_buckets`.
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
    else:
        custom = [
            (_span([params[i].path for i in bp.order[a:z]]), "—", format_bytes(b))
            for a, z, b in zip(starts, stops, seg_bytes)
        ]
    custom = np.array(custom, dtype=object).reshape(len(custom), 3)
    fig = go.Figure()
    for k, kind in enumerate(_KINDS):
        mask = seg_kinds == k
        if not mask.any():
            continue
        fig.add_trace(go.Bar(
            x=seg_bucket[mask], y=seg_bytes[mask] / MiB, base=seg_base[mask] / MiB, name=kind,
            marker=dict(color=KIND_COLORS[kind], line_width=0), customdata=custom[mask],
            hovertemplate="bucket %{x}<br>%{customdata[0]}<br>shape %{customdata[1]}<br>%{customdata[2]}"
                          f"<extra>{kind}</extra>",
        ))
    bucket_mib = bp.bucket_bytes / MiB
    if cap > 0:
        fig.add_shape(type="line", name="communication_size", xref="paper", x0=0, x1=1, y0=cap / MiB, y1=cap / MiB,
                      line=dict(color="#333333", width=1.5, dash="dash"))
        fig.add_annotation(name="communication_size", xref="paper", x=1, y=cap / MiB, xanchor="right",
                           yanchor="bottom", showarrow=False, text=f"communication_size = {format_bytes(cap)}")
        if num_b and bp.bucket_bytes[-1] < cap:
            fig.add_annotation(name="tail", x=num_b - 1, y=bucket_mib[-1], ax=-40, ay=-40, arrowhead=2,
                               text=f"tail: {format_bytes(bp.bucket_bytes[-1])}", bgcolor="#FFF3CD")
    merged = "" if level == "array" else f"; segments are merged {level}s"
    under = f", {bp.num_under_threshold} below the cap" if cap > 0 else ""
    title = (
        f"{spec.name}: {num_b} buckets = {bp.num_allreduces_per_step} all-reduces per DDP step "
        f"(policy {bp.policy.name})<br><sup>communication_size {format_bytes(cap) if cap > 0 else '0 (one bucket per array)'}"
        f"{under}; {len(spec)} arrays, {format_bytes(spec.nbytes)}{merged}</sup>"
    )
    return _layout(fig, title, height, barmode="overlay", bargap=0.15,
                   xaxis=dict(title="bucket", range=[-0.5, max(num_b, 1) - 0.5]), yaxis=dict(title="MiB"))


# --------------------------------------------------------------------------- shards


def _rank_segments(plan: ShardPlan, bucket: int, rank: int):
    """Rank ``rank``'s shard buffer for ``bucket``: real pieces and padding, in local element offsets.

    Returns ``(pieces, padding)``: pieces are ``(array position in bucket, path, start,
    stop, local_start)`` from :meth:`ShardPlan.rank_slices`; padding is ``(local_start,
    local_stop)``. Row layout reserves each array's chunk (``param_chunk_elems``) in
    turn; flat and greedy pack pieces back to back, flat padding its chunk at the end.
    """
    arrays = plan.buckets.bucket(bucket)
    paths = [plan.buckets.spec.params[i].path for i in arrays]
    mine = {s.path: s for s in plan.rank_slices(rank) if s.bucket == bucket}
    pieces, padding, local = [], [], 0
    for k, path in enumerate(paths):
        s = mine.get(path)
        real = s.stop - s.start if s else 0
        if real:
            pieces.append((k, path, s.start, s.stop, local))
        slot = int(plan.param_chunk_elems[arrays[k]]) if plan.layout == "row" else real
        if slot > real:
            padding.append((local + real, local + slot))
        local += slot
    if plan.layout != "greedy" and plan.bucket_chunk_elems[bucket] > local:
        padding.append((local, int(plan.bucket_chunk_elems[bucket])))
    return pieces, padding


def _merge_pieces(pieces: list, group: int) -> list:
    """Consecutive pieces in groups of ``group`` arrays (for buckets with very many arrays)."""
    out = []
    for g in range(0, len(pieces), group):
        chunk = pieces[g : g + group]
        end = chunk[-1][4] + chunk[-1][3] - chunk[-1][2]
        out.append((chunk[0][0], _span([p[1] for p in chunk]), chunk[0][2], chunk[-1][3], chunk[0][4], end))
    return out


def fig_shard_map(plans: Mapping[str, ShardPlan], bucket: int = 0, *, height: int | None = None) -> go.Figure:
    """Who owns which elements of one bucket, one subplot per plan, side by side.

    y is the rank, x the element offset in that rank's local shard buffer of the
    bucket; segments are coloured by parameter (hover: path, its elements
    ``[start, stop)``, the local offsets) and padding is grey. With N >
    :data:`MAX_RANKS_SHOWN` only the first and last half of that many ranks are
    drawn (labelled with their rank; the title says so).

    Args:
        plans: ``{label: ShardPlan}``, typically row and flat of one bucket plan.
        bucket: Bucket index, valid in every plan.
        height: Figure height in pixels (default: from the number of ranks drawn).

    Raises:
        ValueError: on no plans or a bucket index out of range (named with the plan).
    """
    if not plans:
        raise ValueError("fig_shard_map needs at least one plan.")
    for label, plan in plans.items():
        if not 0 <= bucket < plan.buckets.num_buckets:
            raise ValueError(f"Bucket {bucket} is out of range for plan '{label}' ({plan.buckets.num_buckets} buckets).")
    labels = list(plans)
    titles = [f"{label}: {plan.layout}, N={plan.num_shards}, {int(plan.bucket_chunk_elems[bucket]) if plan.layout != 'greedy' else 'whole arrays'}"
              f"{' elements per rank' if plan.layout != 'greedy' else ''}" for label, plan in plans.items()]
    fig = make_subplots(rows=1, cols=len(plans), subplot_titles=titles, horizontal_spacing=0.08)
    max_shown, notes = 1, []
    for col, label in enumerate(labels, start=1):
        plan = plans[label]
        ranks = _shown_ranks(plan.num_shards)
        max_shown = max(max_shown, len(ranks))
        real, pad = [], []
        for y, rank in enumerate(ranks):
            pieces, padding = _rank_segments(plan, bucket, int(rank))
            if len(pieces) > MAX_SEGMENTS_PER_RANK:
                group = -(-len(pieces) // MAX_SEGMENTS_PER_RANK)
                notes.append(f"{label}: arrays merged in groups of {group}")
                pieces = _merge_pieces(pieces, group)
            else:
                pieces = [(k, path, a, z, lo, lo + z - a) for k, path, a, z, lo in pieces]
            real += [(y, int(rank), *p) for p in pieces]
            pad += [(y, int(rank), lo, hi) for lo, hi in padding]
        if real:
            y, rank, k, path, a, z, lo, hi = (np.array(c, dtype=object) for c in zip(*real))
            fig.add_trace(go.Bar(
                orientation="h", y=y.astype(np.int64), x=(hi - lo).astype(np.int64), base=lo.astype(np.int64),
                name=f"{label} arrays", showlegend=False, width=0.8,
                marker=dict(color=[PARAM_COLORS[int(i) % len(PARAM_COLORS)] for i in k], line_width=0),
                customdata=np.stack([path, a, z, lo, hi, rank], axis=1),
                hovertemplate="rank %{customdata[5]}<br>%{customdata[0]}<br>elements [%{customdata[1]}, %{customdata[2]})"
                              "<br>local [%{customdata[3]}, %{customdata[4]})<extra></extra>",
            ), row=1, col=col)
        if pad:
            y, rank, lo, hi = (np.array(c, dtype=np.int64) for c in zip(*pad))
            fig.add_trace(go.Bar(
                orientation="h", y=y, x=hi - lo, base=lo, name="padding", legendgroup="padding", width=0.8,
                showlegend=not any(t.name == "padding" for t in fig.data), marker=dict(color=PADDING_COLOR, line_width=0),
                customdata=np.stack([lo, hi, rank], axis=1),
                hovertemplate="rank %{customdata[2]}<br>padding, local [%{customdata[0]}, %{customdata[1]})<extra></extra>",
            ), row=1, col=col)
        fig.update_yaxes(tickvals=list(range(len(ranks))), ticktext=[str(r) for r in ranks], autorange="reversed",
                         title="rank" if col == 1 else None, row=1, col=col)
        fig.update_xaxes(title="element offset in the rank's shard", row=1, col=col)
        if len(ranks) < plan.num_shards:
            fig.add_hline(y=len(ranks) / 2 - 0.5, line=dict(color="#555555", width=1, dash="dot"), row=1, col=col)
            notes.append(f"{label}: ranks 0–{len(ranks) // 2 - 1} and {plan.num_shards - len(ranks) // 2}–"
                         f"{plan.num_shards - 1} of {plan.num_shards} shown")
    bp = next(iter(plans.values())).buckets
    title = (f"Bucket {bucket} of {bp.num_buckets}: {len(bp.bucket(bucket))} arrays, "
             f"{format_bytes(bp.bucket_bytes[bucket])}<br><sup>{'; '.join(dict.fromkeys(notes)) or 'all ranks shown'}</sup>")
    return _layout(fig, title, height or 170 + 24 * max_shown, barmode="overlay")


def fig_rank_load(plans: Mapping[str, ShardPlan], *, height: int | None = None) -> go.Figure:
    """Bytes each rank holds, owned and padding stacked, one row of subplots per plan.

    With N > :data:`MAX_RANK_BINS` ranks are binned: bars are bin means, markers
    the bin minimum and maximum of the rank total. A dotted line (shape named
    ``"mean"``) marks the mean rank total, so ``imbalance`` = max / that line.

    Args:
        plans: ``{label: ShardPlan}``.
        height: Figure height in pixels (default: 190 per plan plus margins).
    """
    if not plans:
        raise ValueError("fig_rank_load needs at least one plan.")
    titles = [f"{label}: max {format_bytes(p.rank_bytes.max())}, imbalance {p.imbalance:.3f}, "
              f"padding {format_bytes(p.padding_bytes)}" for label, p in plans.items()]
    fig = make_subplots(rows=len(plans), cols=1, subplot_titles=titles, vertical_spacing=0.32 / len(plans))
    notes = []
    for row, (label, plan) in enumerate(plans.items(), start=1):
        n = plan.num_shards
        edges = _rank_edges(n)
        counts = np.diff(edges)
        owned = np.add.reduceat(plan.rank_owned_bytes, edges[:-1]) / counts
        padding = np.add.reduceat(plan.rank_padding_bytes, edges[:-1]) / counts
        x = (edges[:-1] + edges[1:] - 1) / 2
        custom = np.stack([edges[:-1], edges[1:] - 1, [format_bytes(v) for v in owned],
                           [format_bytes(v) for v in padding]], axis=1).astype(object)
        ranks = "ranks %{customdata[0]}–%{customdata[1]} (mean)" if len(counts) < n else "rank %{customdata[0]}"
        color = LAYOUT_COLORS.get(plan.layout, SERIES_COLORS[(row - 1) % len(SERIES_COLORS)])
        fig.add_trace(go.Bar(x=x, y=owned / MiB, width=counts * 0.9, name=f"{label} owned", marker=dict(color=color, line_width=0),
                             customdata=custom, hovertemplate=f"{ranks}<br>owned %{{customdata[2]}}<extra>{label}</extra>"),
                      row=row, col=1)
        fig.add_trace(go.Bar(x=x, y=padding / MiB, base=owned / MiB, width=counts * 0.9, name="padding", legendgroup="padding",
                             showlegend=row == 1, marker=dict(color=PADDING_COLOR, line_width=0), customdata=custom,
                             hovertemplate=f"{ranks}<br>padding %{{customdata[3]}}<extra>{label}</extra>"),
                      row=row, col=1)
        if len(counts) < n:
            total = plan.rank_bytes
            for stat, func, symbol in (("max", np.maximum, "triangle-up"), ("min", np.minimum, "triangle-down")):
                fig.add_trace(go.Scatter(x=x, y=func.reduceat(total, edges[:-1]) / MiB, mode="markers", name=f"bin {stat}",
                                         legendgroup=f"bin {stat}", showlegend=not any(t.name == f"bin {stat}" for t in fig.data),
                                         marker=dict(color="#333333", symbol=symbol, size=6),
                                         hovertemplate=f"ranks %{{x}}<br>{stat} %{{y:.3f}} MiB<extra>{label}</extra>"),
                              row=row, col=1)
            notes.append(f"{label}: {n} ranks in {len(counts)} bins of ~{n // len(counts)} (bars: bin means; markers: min/max)")
        mean = float(plan.rank_bytes.mean()) / MiB
        fig.add_hline(y=mean, name="mean", line=dict(color="#333333", width=1, dash="dot"), row=row, col=1)
        fig.update_yaxes(title="MiB", row=row, col=1)
        fig.update_xaxes(title="rank" if row == len(plans) else None, row=row, col=1)
    title = f"Bytes per rank (owned + padding)<br><sup>{'; '.join(notes) or 'every rank shown'}</sup>"
    return _layout(fig, title, height or 110 + 190 * len(plans), barmode="overlay", bargap=0)


#: Columns of :func:`fig_layout_metrics`: header, and the cell text from ``(summary, plan)``.
METRIC_COLUMNS = (
    ("N", lambda s, p: str(s["num_shards"])),
    ("buckets", lambda s, p: str(s["num_buckets"])),
    ("max bytes / rank", lambda s, p: format_bytes(s["max_rank_bytes"])),
    ("mean bytes / rank", lambda s, p: format_bytes(s["mean_rank_bytes"])),
    ("imbalance (max/mean)", lambda s, p: f"{s['imbalance']:.3f}"),
    ("padding (all ranks)", lambda s, p: format_bytes(s["padding_bytes"])),
    ("split arrays", lambda s, p: str(s["num_split_arrays"])),
    ("fragments / rank (max)", lambda s, p: str(s["max_fragments_per_rank"])),
    ("fragments / rank (mean)", lambda s, p: f"{s['mean_fragments_per_rank']:.1f}"),
    ("collectives / step", lambda s, p: str(s["num_collectives_per_step"])),
    ("of which", lambda s, p: " + ".join(
        f"{num} {kind}" for num, kind in ((p.num_reduce_scatters, "RS"), (p.num_all_gathers, "AG"),
                                          (p.num_all_reduces, "AR"), (p.num_broadcasts, "bcast")) if num)),
)


def fig_layout_metrics(plans: Mapping[str, ShardPlan], *, height: int | None = None) -> go.Figure:
    """A table comparing layouts, one row per plan, from :meth:`ShardPlan.summary` (see :data:`METRIC_COLUMNS`)."""
    if not plans:
        raise ValueError("fig_layout_metrics needs at least one plan.")
    rows = [[label] + [cell(plan.summary(), plan) for _, cell in METRIC_COLUMNS] for label, plan in plans.items()]
    fig = go.Figure(go.Table(
        header=dict(values=["layout"] + [name for name, _ in METRIC_COLUMNS], fill_color="#E8EEF5", align="left"),
        cells=dict(values=[list(col) for col in zip(*rows)], align="left", height=26),
        columnwidth=[1.1] + [1.0] * len(METRIC_COLUMNS),
    ))
    bp = next(iter(plans.values())).buckets
    title = f"Layouts compared: {bp.spec.name}, {bp.num_buckets} buckets (policy {bp.policy.name})"
    fig = _layout(fig, title, height or 150 + 28 * len(rows))
    fig.update_layout(margin=dict(t=50, b=10))
    return fig


# --------------------------------------------------------------------------- sweeps


def fig_buckets_vs_size(spec: ModelSpec, sizes_bytes: Iterable[int], policies: Sequence[str] = ("mlx", "pytorch-ddp"),
                        *, height: int = 380) -> go.Figure:
    """Bucket count (= all-reduces per DDP step) and largest bucket against ``communication_size``.

    Args:
        spec: The model.
        sizes_bytes: Caps to plan with, in bytes, all ``> 0`` (the x axis is log).
        policies: Bucket policy names, one line each.
        height: Figure height in pixels.

    Raises:
        ValueError: on an empty or non-positive ``sizes_bytes``.
    """
    sizes = np.unique(np.asarray(list(sizes_bytes), dtype=np.int64))
    if not len(sizes) or sizes[0] <= 0:
        raise ValueError(f"sizes_bytes must be non-empty and all > 0 for a log axis, got {sizes.tolist()}.")
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=("buckets = all-reduces per DDP step", "largest bucket (MiB)"))
    labels = [format_bytes(s) for s in sizes]
    for k, name in enumerate(policies):
        bucket_plans = [plan_buckets(spec, int(s), policy=name) for s in sizes]
        color = SERIES_COLORS[k % len(SERIES_COLORS)]
        common = dict(x=sizes / MiB, mode="lines+markers", name=name, legendgroup=name, customdata=labels,
                      line=dict(color=color))
        fig.add_trace(go.Scatter(y=[p.num_buckets for p in bucket_plans], **common,
                                 hovertemplate="cap %{customdata}<br>%{y} buckets<extra>" + name + "</extra>"), row=1, col=1)
        fig.add_trace(go.Scatter(y=[p.bucket_bytes.max() / MiB for p in bucket_plans], showlegend=False, **common,
                                 hovertemplate="cap %{customdata}<br>largest %{y:.2f} MiB<extra>" + name + "</extra>"),
                      row=1, col=2)
    fig.add_trace(go.Scatter(x=sizes / MiB, y=sizes / MiB, mode="lines", name="largest = cap",
                             line=dict(color="#999999", dash="dot"), hoverinfo="skip"), row=1, col=2)
    fig.update_xaxes(type="log", title="communication_size (MiB)")
    fig.update_yaxes(type="log")
    title = f"{spec.name}: buckets vs communication_size<br><sup>{len(spec)} arrays, {format_bytes(spec.nbytes)}</sup>"
    return _layout(fig, title, height)


def fig_padding_vs_shards(bucket_plan: BucketPlan, num_shards_list: Iterable[int], *, height: int = 380) -> go.Figure:
    """Padding bytes (all ranks) and max fragments per rank against N, for row (``pad_rows=True``) and flat.

    Args:
        bucket_plan: From :func:`workbench.buckets.plan_buckets`.
        num_shards_list: Values of N (each >= 1).
        height: Figure height in pixels.
    """
    ns = np.unique(np.asarray(list(num_shards_list), dtype=np.int64))
    if not len(ns):
        raise ValueError("num_shards_list must not be empty.")
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=("padding, all ranks (MiB)", "max fragments per rank"))
    for name, kwargs in (("row", dict(pad_rows=True)), ("flat", {})):
        shard_plans = [plan_shards(bucket_plan, int(n), name, **kwargs) for n in ns]
        label = "row (pad_rows)" if name == "row" else name
        common = dict(x=ns, mode="lines+markers", name=label, legendgroup=name, line=dict(color=LAYOUT_COLORS[name]))
        fig.add_trace(go.Scatter(y=[p.padding_bytes / MiB for p in shard_plans], **common,
                                 customdata=[format_bytes(p.padding_bytes) for p in shard_plans],
                                 hovertemplate="N=%{x}<br>padding %{customdata}<extra>" + label + "</extra>"), row=1, col=1)
        fig.add_trace(go.Scatter(y=[int(p.rank_fragments.max()) for p in shard_plans], showlegend=False, **common,
                                 hovertemplate="N=%{x}<br>%{y} fragments<extra>" + label + "</extra>"), row=1, col=2)
    fig.update_xaxes(type="log", title="N (ranks)", tickvals=ns.tolist(), ticktext=[str(n) for n in ns])
    bp = bucket_plan
    title = (f"{bp.spec.name}: padding and fragmentation vs N<br><sup>{bp.num_buckets} buckets, "
             f"communication_size {format_bytes(bp.communication_size)}, policy {bp.policy.name}</sup>")
    return _layout(fig, title, height)

"""Figures of bucket and shard plans.

Every ``fig_*`` function returns a :class:`plotly.graph_objects.Figure` and never
shows it. Figures only aggregate what the planners computed (sums, bin means,
cumulative offsets for drawing); every number they show can be reproduced by
calling :func:`workbench.core.buckets.plan_buckets` or :func:`workbench.core.shards.plan_shards`.

Figures stay small and fast on large plans (Llama-3-70B has 723 arrays; N may be
1024): one bar trace per colour group with ``base=`` for stacked segments, never
one trace per parameter; a shard map shows at most :data:`MAX_RANKS_SHOWN` ranks
(the first and last halves) and a rank-load figure at most :data:`MAX_RANK_BINS`
bins. Titles say when either kicks in. Sizes on axes are MiB (2**20 bytes).
"""

from __future__ import annotations

import copy
import functools
import re
from typing import Iterable, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from workbench.core.buckets import BucketPlan, plan_buckets
from workbench.core.shards import ShardPlan, plan_shards
from workbench.core.specs import ModelSpec
from workbench.core.units import MiB, format_bytes

#: The house style, owned here rather than taken from a plotly built-in: a stored figure carries these
#: few settings (plotly_white's look), so it does not change when plotly's own templates do.
TEMPLATE = go.layout.Template(
    layout=dict(
        autotypenumbers="strict", font=dict(color="#2a3f5f"), paper_bgcolor="white", plot_bgcolor="white",
        colorway=["#636efa", "#EF553B", "#00cc96", "#ab63fa", "#FFA15A", "#19d3f3", "#FF6692", "#B6E880",
                  "#FF97FF", "#FECB52"],
        hovermode="closest", hoverlabel=dict(align="left"), title=dict(x=0.05),
        xaxis=dict(gridcolor="#EBF0F8", linecolor="#EBF0F8", zerolinecolor="#EBF0F8", zerolinewidth=2, ticks="",
                   automargin=True, title=dict(standoff=15)),
        yaxis=dict(gridcolor="#EBF0F8", linecolor="#EBF0F8", zerolinecolor="#EBF0F8", zerolinewidth=2, ticks="",
                   automargin=True, title=dict(standoff=15)),
        shapedefaults=dict(line=dict(color="#2a3f5f")),
        annotationdefaults=dict(arrowcolor="#2a3f5f", arrowhead=0, arrowwidth=1),
    ),
    data=dict(bar=[dict(marker=dict(line=dict(color="white", width=0.5)))]),
)
#: Colour of each parameter kind (see :func:`param_kind`).
KIND_COLORS = {
    "embedding": "#4C78A8", "attention": "#F58518", "mlp": "#54A24B",
    "expert": "#B279A2", "norm": "#E45756", "other": "#9D755D",
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


@functools.lru_cache(maxsize=1)
def _template() -> dict:
    return TEMPLATE.to_plotly_json()


def _figure(traces: list[dict], layout: dict, title: str, height: int) -> go.Figure:
    """One figure from trace and layout dicts, with the house template, title and height."""
    base = dict(
        template=copy.deepcopy(_template()), height=height,
        title=dict(text=title, x=0.01, xanchor="left", font=dict(size=14)),
        margin=dict(l=60, r=20, t=80, b=60), legend=dict(orientation="h", yanchor="top", y=-0.18, x=0),
    )
    # Every trace and layout key here is written by this module, and validating them (which also
    # deep-copies the template) takes several times longer than building the figure; tests
    # validate every figure instead (go.Figure(fig.to_dict())).
    return go.Figure(dict(data=traces, layout={**base, **layout}), _validate=False)


def _grid(rows: int, cols: int, titles: Sequence[str], hspace: float = 0.08, vspace: float = 0.12):
    """Axes of a rows x cols grid (as ``make_subplots`` lays it out, without its cost).

    Returns ``(layout, refs)``: layout holds the axes and subplot-title annotations;
    ``refs[k]`` is the ``(xaxis, yaxis)`` pair of cell ``k`` in row-major order.
    """
    width = (1 - hspace * (cols - 1)) / cols
    height = (1 - vspace * (rows - 1)) / rows
    layout, refs, annotations = {}, [], []
    for k in range(rows * cols):
        r, c = divmod(k, cols)
        suffix = "" if k == 0 else str(k + 1)
        x0, y1 = c * (width + hspace), 1 - r * (height + vspace)
        layout[f"xaxis{suffix}"] = dict(domain=[max(x0, 0.0), min(x0 + width, 1.0)], anchor=f"y{suffix}")
        layout[f"yaxis{suffix}"] = dict(domain=[max(y1 - height, 0.0), min(y1, 1.0)], anchor=f"x{suffix}")  # no -1e-17
        refs.append((f"x{suffix}", f"y{suffix}"))
        if k < len(titles):
            annotations.append(dict(text=titles[k], x=x0 + width / 2, y=y1, xref="paper", yref="paper",
                                    xanchor="center", yanchor="bottom", showarrow=False, font=dict(size=12)))
    layout["annotations"] = annotations
    return layout, refs


def _hline(y: float, xref: str, yref: str, name: str, dash: str = "dot") -> dict:
    ref = "x domain" if xref == "x" else f"{xref} domain"
    return dict(type="line", name=name, xref=ref, x0=0, x1=1, yref=yref, y0=y, y1=y,
                line=dict(color="#333333", width=1, dash=dash))


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
    parameter coloured by :func:`param_kind` (hover: path, shape, size). The
    ``communication_size`` cap is a dashed line (shape named ``"communication_size"``,
    omitted when the cap is ``<= 0``); a last bucket below the cap is marked by an
    annotation named ``"tail"``.

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
        custom = [(_span([params[i].path for i in bp.order[a:z]]),) for a, z in zip(starts, stops)]
        hover = "bucket %{x}<br>%{customdata[0]}<br>%{y:.3f} MiB"
    custom = np.array(custom, dtype=object).reshape(len(custom), -1)
    traces = []
    for k, kind in enumerate(_KINDS):
        mask = seg_kinds == k
        if mask.any():
            traces.append(dict(
                type="bar", x=seg_bucket[mask], y=seg_bytes[mask] / MiB, base=seg_base[mask] / MiB, name=kind,
                marker=dict(color=KIND_COLORS[kind], line=dict(width=0)), customdata=custom[mask],
                hovertemplate=f"{hover}<extra>{kind}</extra>",
            ))
    shapes, annotations = [], []
    if cap > 0:
        shapes.append(_hline(cap / MiB, "x", "y", "communication_size", dash="dash"))
        annotations.append(dict(name="communication_size", xref="paper", x=1, y=cap / MiB, xanchor="right",
                                yanchor="bottom", showarrow=False, text=f"communication_size = {format_bytes(cap)}"))
        if num_b and bp.bucket_bytes[-1] < cap:
            annotations.append(dict(name="tail", x=num_b - 1, y=bp.bucket_bytes[-1] / MiB, ax=-40, ay=-40, arrowhead=2,
                                    text=f"tail: {format_bytes(bp.bucket_bytes[-1])}", bgcolor="#FFF3CD"))
    if cap > 0:
        first = bp.policy.first_bucket_bytes
        cap_text = (f"{format_bytes(cap)}" + (f", first bucket of each dtype {format_bytes(first)}" if first else "")
                    + f" (buckets below it: {bp.num_under_threshold})")
    else:
        cap_text = "0 (one bucket per array)"
    merged = "" if level == "array" else f"; segments are merged {level}s"
    title = (f"{spec.name}: {num_b} buckets = {bp.num_allreduces_per_step} all-reduces per DDP step "
             f"(policy {bp.policy.name})<br><sup>communication_size {cap_text}; {len(spec)} arrays, "
             f"{format_bytes(spec.nbytes)}{merged}</sup>")
    layout = dict(barmode="overlay", bargap=0.15, shapes=shapes, annotations=annotations,
                  xaxis=dict(title=dict(text="bucket"), range=[-0.5, max(num_b, 1) - 0.5]),
                  yaxis=dict(title=dict(text="MiB")))
    return _figure(traces, layout, title, height)


# --------------------------------------------------------------------------- shards


def _rank_segments(plan: ShardPlan, bucket: int, rank: int) -> tuple[list, list]:
    """Rank ``rank``'s shard buffer for ``bucket``: real pieces and padding, in local element offsets.

    Returns ``(pieces, padding)``: pieces are ``(array position in bucket, path, start,
    stop, local_start, local_stop)`` from :meth:`ShardPlan.rank_slices`; padding is
    ``(local_start, local_stop)``. Row reserves each array's chunk
    (``param_chunk_elems``) in turn; flat and greedy pack pieces back to back, and
    flat pads its chunk (``bucket_chunk_elems``) at the end.
    """
    arrays = plan.buckets.bucket(bucket)
    params = plan.buckets.spec.params
    mine = {s.path: s for s in plan.rank_slices(rank, bucket)}
    pieces, padding, local = [], [], 0
    for k, i in enumerate(arrays):
        s = mine.get(params[i].path)
        real = s.stop - s.start if s else 0
        if real:
            pieces.append((k, s.path, s.start, s.stop, local, local + real))
        slot = int(plan.param_chunk_elems[i]) if plan.layout == "row" else real
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
        run = pieces[g : g + group]
        out.append((run[0][0], _span([p[1] for p in run]), run[0][2], run[-1][3], run[0][4], run[-1][5]))
    return out


def fig_shard_map(plans: Mapping[str, ShardPlan], bucket: int = 0, *, height: int | None = None) -> go.Figure:
    """Who owns which elements of one bucket, one subplot per plan, side by side.

    y is the rank, x the element offset in that rank's local shard buffer of the
    bucket; segments are coloured by parameter (hover: path, its elements
    ``[start, stop)``, the local offsets) and padding is grey. With N >
    :data:`MAX_RANKS_SHOWN` only the first and last half of that many ranks are
    drawn, labelled with their rank and split by a dotted line; the title says so.

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
    titles = [f"{label}: N={p.num_shards}, " + (f"{int(p.bucket_chunk_elems[bucket]):,} elements per rank"
                                                  if p.layout != "greedy" else "whole arrays per rank")
              for label, p in plans.items()]
    layout, refs = _grid(1, len(plans), titles)
    traces, shapes, notes, max_shown = [], [], [], 1
    for (label, plan), (xref, yref) in zip(plans.items(), refs):
        ranks = _shown_ranks(plan.num_shards)
        max_shown = max(max_shown, len(ranks))
        real, pad = [], []
        for y, rank in enumerate(ranks.tolist()):
            pieces, padding = _rank_segments(plan, bucket, rank)
            if len(pieces) > MAX_SEGMENTS_PER_RANK:
                group = -(-len(pieces) // MAX_SEGMENTS_PER_RANK)
                notes.append(f"{label}: arrays merged in groups of {group}")
                pieces = _merge_pieces(pieces, group)
            real += [(y, rank, *p) for p in pieces]
            pad += [(y, rank, lo, hi) for lo, hi in padding]
        if real:
            y, rank, k, path, a, z, lo, hi = zip(*real)
            lo, hi = np.array(lo, np.int64), np.array(hi, np.int64)
            traces.append(dict(
                type="bar", orientation="h", y=np.array(y), x=hi - lo, base=lo, name=f"{label} arrays",
                xaxis=xref, yaxis=yref, showlegend=False, width=0.8,
                marker=dict(color=[PARAM_COLORS[i % len(PARAM_COLORS)] for i in k], line=dict(width=0)),
                customdata=np.array(list(zip(path, a, z, lo.tolist(), hi.tolist(), rank)), dtype=object),
                hovertemplate="rank %{customdata[5]}<br>%{customdata[0]}<br>elements [%{customdata[1]}, %{customdata[2]})"
                              "<br>local [%{customdata[3]}, %{customdata[4]})<extra></extra>",
            ))
        if pad:
            y, rank, lo, hi = (np.array(c, np.int64) for c in zip(*pad))
            traces.append(dict(
                type="bar", orientation="h", y=y, x=hi - lo, base=lo, name="padding", legendgroup="padding",
                xaxis=xref, yaxis=yref, width=0.8, showlegend=not any(t["name"] == "padding" for t in traces),
                marker=dict(color=PADDING_COLOR, line=dict(width=0)), customdata=np.stack([lo, hi, rank], axis=1),
                hovertemplate="rank %{customdata[2]}<br>padding, local [%{customdata[0]}, %{customdata[1]})<extra></extra>",
            ))
        axis = "yaxis" + yref[1:]
        layout[axis].update(tickvals=list(range(len(ranks))), ticktext=[str(r) for r in ranks], autorange="reversed")
        layout["xaxis" + xref[1:]].update(title=dict(text="element offset in the rank's shard"))
        if len(ranks) < plan.num_shards:
            half = len(ranks) // 2
            shapes.append(_hline(half - 0.5, xref, yref, "hidden ranks"))
            notes.append(f"ranks 0–{half - 1} and {plan.num_shards - half}–{plan.num_shards - 1} of {plan.num_shards} shown")
    layout["yaxis"]["title"] = dict(text="rank")
    bp = next(iter(plans.values())).buckets
    title = (f"Bucket {bucket} of {bp.num_buckets}: {len(bp.bucket(bucket))} arrays, "
             f"{format_bytes(bp.bucket_bytes[bucket])}<br><sup>{'; '.join(dict.fromkeys(notes)) or 'all ranks shown'}</sup>")
    return _figure(traces, {**layout, "barmode": "overlay", "shapes": shapes}, title, height or 190 + 24 * max_shown)


def fig_rank_load(plans: Mapping[str, ShardPlan], *, height: int | None = None) -> go.Figure:
    """Bytes each rank holds, owned and padding stacked, one row of subplots per plan.

    With N > :data:`MAX_RANK_BINS` ranks are binned: bars are bin means, markers
    the bin minimum and maximum of the rank total. A dotted line (shape named
    ``"mean"``) marks the mean rank total, so ``imbalance`` is the highest bar or
    marker over that line.

    Args:
        plans: ``{label: ShardPlan}``.
        height: Figure height in pixels (default: 200 per plan plus margins).
    """
    if not plans:
        raise ValueError("fig_rank_load needs at least one plan.")
    titles = [f"{label} ({p.layout}, N={p.num_shards}): max {format_bytes(p.rank_bytes.max())}, "
              f"imbalance {p.imbalance:.3f}, padding {format_bytes(p.padding_bytes)}" for label, p in plans.items()]
    layout, refs = _grid(len(plans), 1, titles, vspace=0.3 / len(plans))
    traces, shapes, notes = [], [], []
    for row, ((label, plan), (xref, yref)) in enumerate(zip(plans.items(), refs)):
        n = plan.num_shards
        edges = _rank_edges(n)
        counts = np.diff(edges)
        owned = np.add.reduceat(plan.rank_owned_bytes, edges[:-1]) / counts
        padding = np.add.reduceat(plan.rank_padding_bytes, edges[:-1]) / counts
        x = (edges[:-1] + edges[1:] - 1) / 2
        custom = np.stack([edges[:-1], edges[1:] - 1], axis=1)
        binned = len(counts) < n
        ranks = "ranks %{customdata[0]}–%{customdata[1]} (mean)" if binned else "rank %{customdata[0]}"
        color = LAYOUT_COLORS.get(plan.layout, SERIES_COLORS[row % len(SERIES_COLORS)])
        common = dict(type="bar", x=x, width=counts * 0.9, xaxis=xref, yaxis=yref, customdata=custom)
        traces.append(dict(common, y=owned / MiB, name=f"{label} owned", marker=dict(color=color, line=dict(width=0)),
                           hovertemplate=f"{ranks}<br>owned %{{y:.3f}} MiB<extra>{label}</extra>"))
        traces.append(dict(common, y=padding / MiB, base=owned / MiB, name="padding", legendgroup="padding",
                           showlegend=row == 0, marker=dict(color=PADDING_COLOR, line=dict(width=0)),
                           hovertemplate=f"{ranks}<br>padding %{{y:.3f}} MiB<extra>{label}</extra>"))
        if binned:
            for stat, func, symbol in (("max", np.maximum, "triangle-up"), ("min", np.minimum, "triangle-down")):
                traces.append(dict(
                    type="scatter", x=x, y=func.reduceat(plan.rank_bytes, edges[:-1]) / MiB, mode="markers",
                    name=f"bin {stat}", legendgroup=f"bin {stat}", xaxis=xref, yaxis=yref,
                    showlegend=not any(t["name"] == f"bin {stat}" for t in traces),
                    marker=dict(color="#333333", symbol=symbol, size=6), customdata=custom,
                    hovertemplate=f"ranks %{{customdata[0]}}–%{{customdata[1]}}<br>{stat} %{{y:.3f}} MiB"
                                  f"<extra>{label}</extra>",
                ))
            notes.append(f"{label}: {n} ranks in {len(counts)} bins (bars: bin means; markers: bin min/max)")
        shapes.append(_hline(float(plan.rank_bytes.mean()) / MiB, xref, yref, "mean"))
        layout["yaxis" + yref[1:]].update(title=dict(text="MiB"))
    layout["xaxis" + refs[len(plans) - 1][0][1:]].update(title=dict(text="rank"))
    title = f"Bytes per rank (owned + padding)<br><sup>{'; '.join(notes) or 'every rank shown'}</sup>"
    return _figure(traces, {**layout, "barmode": "overlay", "bargap": 0, "shapes": shapes}, title,
                   height or 120 + 200 * len(plans))


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
    """A table comparing layouts, one row per plan, from :meth:`ShardPlan.summary` (columns: :data:`METRIC_COLUMNS`)."""
    if not plans:
        raise ValueError("fig_layout_metrics needs at least one plan.")
    rows = [[label] + [cell(plan.summary(), plan) for _, cell in METRIC_COLUMNS] for label, plan in plans.items()]
    table = dict(
        type="table", columnwidth=[1.2] + [1.0] * len(METRIC_COLUMNS),
        header=dict(values=["layout"] + [name for name, _ in METRIC_COLUMNS], fill=dict(color="#E8EEF5"), align="left"),
        cells=dict(values=[list(col) for col in zip(*rows)], align="left", height=26),
    )
    bp = next(iter(plans.values())).buckets
    title = f"Layouts compared: {bp.spec.name}, {bp.num_buckets} buckets (policy {bp.policy.name})"
    return _figure([table], dict(margin=dict(l=10, r=10, t=50, b=10)), title, height or 130 + 30 * len(rows))


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
    layout, ((x1, y1), (x2, y2)) = _grid(1, 2, ("buckets = all-reduces per DDP step", "largest bucket (MiB)"))
    labels = [format_bytes(s) for s in sizes]
    traces = []
    for k, policy in enumerate(policies):
        bucket_plans = [plan_buckets(spec, int(s), policy=policy) for s in sizes]
        name = bucket_plans[0].policy.name
        common = dict(type="scatter", x=sizes / MiB, mode="lines+markers", name=name, legendgroup=name,
                      customdata=labels, line=dict(color=SERIES_COLORS[k % len(SERIES_COLORS)]))
        traces.append(dict(common, y=[p.num_buckets for p in bucket_plans], xaxis=x1, yaxis=y1,
                           hovertemplate=f"cap %{{customdata}}<br>%{{y}} buckets<extra>{name}</extra>"))
        traces.append(dict(common, y=[p.bucket_bytes.max() / MiB for p in bucket_plans], xaxis=x2, yaxis=y2,
                           showlegend=False, hovertemplate=f"cap %{{customdata}}<br>largest %{{y:.2f}} MiB<extra>{name}</extra>"))
    traces.append(dict(type="scatter", x=sizes / MiB, y=sizes / MiB, mode="lines", name="largest = cap", xaxis=x2,
                       yaxis=y2, line=dict(color="#999999", dash="dot"), hoverinfo="skip"))
    for axis in ("xaxis", "xaxis2"):
        layout[axis].update(type="log", title=dict(text="communication_size (MiB)"))
    for axis in ("yaxis", "yaxis2"):
        layout[axis].update(type="log")
    title = f"{spec.name}: buckets vs communication_size<br><sup>{len(spec)} arrays, {format_bytes(spec.nbytes)}</sup>"
    return _figure(traces, layout, title, height)


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
    layout, ((x1, y1), (x2, y2)) = _grid(1, 2, ("padding, all ranks (MiB)", "max fragments per rank"))
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
    return _figure(traces, layout, title, height)

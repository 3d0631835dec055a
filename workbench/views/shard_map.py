"""Who holds what: the shard map of one bucket (each rank's slices of its arrays) and the load per rank.

A shard map draws at most :data:`MAX_RANKS_SHOWN` ranks (the first and last halves); a rank-load figure
at most :data:`MAX_RANK_BINS` bins of ranks.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import plotly.graph_objects as go

from workbench.core.shards import ShardPlan
from workbench.core.units import MiB, format_bytes, plural
from workbench.views.style import (
    LAYOUT_COLORS,
    PADDING_COLOR,
    PARAM_COLORS,
    SERIES_COLORS,
    figure,
    hline,
    path_span,
    subplot_grid,
)

#: Ranks drawn in a shard map; beyond this, the first and last half of it.
MAX_RANKS_SHOWN = 16


#: Rank bins in a rank-load figure; beyond this, ranks are binned.
MAX_RANK_BINS = 64


#: Arrays drawn per rank in a shard map; beyond this, consecutive arrays merge into groups.
MAX_SEGMENTS_PER_RANK = 256


#: Legend entries of arrays in a shard map; beyond this, consecutive arrays share an entry and colour.
MAX_ARRAY_GROUPS = len(PARAM_COLORS)


def _shown_ranks(num_shards: int, rank: int | None = None) -> np.ndarray:
    """The first and last half of :data:`MAX_RANKS_SHOWN` ranks (all when N is that small), plus ``rank``."""
    if num_shards <= MAX_RANKS_SHOWN:
        shown = np.arange(num_shards)
    else:
        half = MAX_RANKS_SHOWN // 2
        shown = np.concatenate([np.arange(half), np.arange(num_shards - half, num_shards)])
    if rank is not None:
        if not 0 <= rank < num_shards:
            raise ValueError(f"rank {rank} is out of range for num_shards={num_shards}.")
        shown = np.union1d(shown, [rank])
    return shown


def _spans(ranks: np.ndarray) -> str:
    """``0–7, 517 and 1016–1023``: runs of consecutive ranks."""
    runs = np.split(ranks, np.flatnonzero(np.diff(ranks) > 1) + 1)
    parts = [f"{r[0]}–{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in runs]
    return ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]


def _array_groups(num_arrays: int) -> np.ndarray:
    """The legend group of each array of a bucket: consecutive arrays, at most :data:`MAX_ARRAY_GROUPS` groups."""
    groups = min(num_arrays, MAX_ARRAY_GROUPS)
    return np.arange(num_arrays) * groups // max(num_arrays, 1)


def _rank_edges(num_shards: int) -> np.ndarray:
    """Bin edges over ranks: one bin per rank up to :data:`MAX_RANK_BINS`, else that many equal bins."""
    num_bins = min(num_shards, MAX_RANK_BINS)
    return np.unique(np.linspace(0, num_shards, num_bins + 1).round().astype(np.int64))


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
        out.append((run[0][0], path_span([p[1] for p in run]), run[0][2], run[-1][3], run[0][4], run[-1][5]))
    return out


def fig_shard_map(plans: Mapping[str, ShardPlan], bucket: int = 0, *, rank: int | None = None,
                  height: int | None = None) -> go.Figure:
    """Who owns which elements of one bucket, one subplot per plan, side by side.

    y is the rank, x the element offset in that rank's local shard buffer of the
    bucket; segments are coloured by array, and the legend names them (one entry per
    array, or per run of consecutive arrays past :data:`MAX_ARRAY_GROUPS`; hover: path,
    its elements ``[start, stop)``, the local offsets); padding is grey. With N >
    :data:`MAX_RANKS_SHOWN` only the first and last half of that many ranks are
    drawn, plus ``rank``, each gap marked by a dotted line (shapes named ``"hidden ranks"``).

    Args:
        plans: ``{label: ShardPlan}``, typically row and flat of one bucket plan.
        bucket: Bucket index, valid in every plan.
        rank: A rank to draw whatever N (bold when it would be hidden); see also
            :func:`workbench.views.rank_inspector.rank_slices_table`.
        height: Figure height in pixels (default: from the number of ranks drawn).

    Raises:
        ValueError: on no plans, a bucket index or rank out of range (named with the plan).
    """
    if not plans:
        raise ValueError("fig_shard_map needs at least one plan.")
    for label, plan in plans.items():
        if not 0 <= bucket < plan.buckets.num_buckets:
            raise ValueError(f"Bucket {bucket} is out of range for plan '{label}' ({plan.buckets.num_buckets} buckets).")
    titles = [f"{label}: N={p.num_shards}, " + (f"{int(p.bucket_chunk_elems[bucket]):,} elements per rank"
                                                  if p.layout != "greedy" else "whole arrays per rank")
              for label, p in plans.items()]
    layout, refs = subplot_grid(1, len(plans), titles)
    bp = next(iter(plans.values())).buckets
    arrays = bp.bucket(bucket)
    group_of = _array_groups(len(arrays))
    group_paths = [[bp.spec.params[i].path for i, g in zip(arrays, group_of) if g == k] for k in range(group_of.max() + 1)]
    traces, shapes, notes, max_shown, in_legend = [], [], [], 1, set()
    for (label, plan), (xref, yref) in zip(plans.items(), refs):
        ranks, usual = _shown_ranks(plan.num_shards, rank), set(_shown_ranks(plan.num_shards).tolist())
        max_shown = max(max_shown, len(ranks))
        real, pad = [], []
        for y, r in enumerate(ranks.tolist()):
            pieces, padding = _rank_segments(plan, bucket, r)
            if len(pieces) > MAX_SEGMENTS_PER_RANK:
                group = -(-len(pieces) // MAX_SEGMENTS_PER_RANK)
                notes.append(f"{label}: arrays merged in groups of {group}")
                pieces = _merge_pieces(pieces, group)
            real += [(y, r, *p) for p in pieces]
            pad += [(y, r, lo, hi) for lo, hi in padding]
        for g, paths in enumerate(group_paths):
            mine = [row for row in real if group_of[row[2]] == g]
            if not mine:
                continue
            y, r, k, path, a, z, lo, hi = zip(*mine)
            lo, hi = np.array(lo, np.int64), np.array(hi, np.int64)
            traces.append(dict(
                type="bar", orientation="h", y=np.array(y), x=hi - lo, base=lo, name=path_span(paths),
                legendgroup=f"arrays {g}", showlegend=g not in in_legend, xaxis=xref, yaxis=yref, width=0.8,
                marker=dict(color=PARAM_COLORS[g], line=dict(width=0.5, color="white")),
                customdata=np.array(list(zip(path, a, z, lo.tolist(), hi.tolist(), r)), dtype=object),
                hovertemplate="rank %{customdata[5]}<br>%{customdata[0]}<br>elements [%{customdata[1]}, %{customdata[2]})"
                              f"<br>local [%{{customdata[3]}}, %{{customdata[4]}})<extra>{label}</extra>",
            ))
            in_legend.add(g)
        if pad:
            y, r, lo, hi = (np.array(c, np.int64) for c in zip(*pad))
            traces.append(dict(
                type="bar", orientation="h", y=y, x=hi - lo, base=lo, name="padding", legendgroup="padding",
                xaxis=xref, yaxis=yref, width=0.8, showlegend=not any(t["name"] == "padding" for t in traces),
                marker=dict(color=PADDING_COLOR, line=dict(width=0)), customdata=np.stack([lo, hi, r], axis=1),
                hovertemplate="rank %{customdata[2]}<br>padding, local [%{customdata[0]}, %{customdata[1]})<extra></extra>",
            ))
        axis = "yaxis" + yref[1:]
        # Rank 0 at the top by an explicit reversed range, not autorange="reversed": plotly.js turns that into
        # autorange=true with the reversal kept only in its computed range, which a live widget's next update
        # lost (issue 29 item 2: after a model change rank 1023 was drawn at the top, and stayed there).
        layout[axis].update(tickvals=list(range(len(ranks))), autorange=False, range=[len(ranks) - 0.5, -0.5],
                            ticktext=[f"<b>{r}</b>" if r == rank and r not in usual else str(r) for r in ranks.tolist()])
        layout["xaxis" + xref[1:]].update(title=dict(text="element offset in the rank's shard"))
        for gap in np.flatnonzero(np.diff(ranks) > 1):
            shapes.append(hline(gap + 0.5, xref, yref, "hidden ranks"))
        if len(ranks) < plan.num_shards:
            notes.append(f"ranks {_spans(ranks)} of {plan.num_shards} shown (dotted: ranks hidden)")
    layout["yaxis"]["title"] = dict(text="rank")
    title = (f"Bucket {bucket} of {bp.num_buckets}: {plural(len(arrays), 'array')}, "
             f"{format_bytes(bp.bucket_bytes[bucket])}<br><sup>{'; '.join(dict.fromkeys(notes)) or 'all ranks shown'}</sup>")
    legend_rows = -(-(len(group_paths) + 1) // 3)  # about three array paths fit a row
    legend_px = 26 + 22 * legend_rows  # its title and rows
    height = height or 150 + 24 * max_shown + legend_px + 60
    margin = dict(l=60, r=20, t=80, b=66 + legend_px)
    # At the figure's bottom edge, in the margin kept for it: clear of the x title at any height (placed in
    # plot fractions, it lay on the title once a deck resized the figure).
    return figure(traces, {**layout, "barmode": "overlay", "shapes": shapes, "margin": margin,
                           "legend": dict(orientation="h", x=0, xanchor="left", yref="container", y=0, yanchor="bottom",
                                          font=dict(size=11), title=dict(text="arrays of the bucket:", side="top"))},
                  title, height)


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
    layout, refs = subplot_grid(len(plans), 1, titles, vspace=0.3 / len(plans))
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
            notes.append(f"{n} ranks in {len(counts)} bins of about {n // len(counts)} (bars: bin means; "
                         "markers: bin min/max)")
        shapes.append(hline(float(plan.rank_bytes.mean()) / MiB, xref, yref, "mean"))
        layout["yaxis" + yref[1:]].update(title=dict(text="MiB"))
    layout["xaxis" + refs[len(plans) - 1][0][1:]].update(title=dict(text="rank"))
    title = f"Bytes per rank (owned + padding)<br><sup>{'<br>'.join(dict.fromkeys(notes)) or 'every rank shown'}</sup>"
    return figure(traces, {**layout, "barmode": "overlay", "bargap": 0, "shapes": shapes}, title,
                   height or 120 + 200 * len(plans))

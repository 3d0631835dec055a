"""The rank inspector: everything one rank holds, bucket by bucket, from :meth:`ShardPlan.rank_slices`.

A shard map draws at most a few ranks of a large N; the inspector answers "what does rank r hold?"
for any r: each slice (bucket, array, elements ``[start, stop)``) with its bytes, as a table a test
can compare with the core, and as HTML for the layout explorer.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from workbench.core.shards import ShardPlan
from workbench.core.units import format_bytes

if TYPE_CHECKING:
    import pandas as pd

#: Rows of the inspector's HTML table before it scrolls.
VISIBLE_ROWS = 12
#: Rows the HTML table holds at most (Llama-3-70B's 723 arrays fit); past it a last row says how many more
#: :func:`rank_slices_table` lists. A rank of qwen3-30b-a3b's 18,868 arrays was 4.8 MB of HTML per model
#: change, seconds for a browser to lay out (issue 29 item 4).
MAX_HTML_ROWS = 1000


def rank_slices_table(plan: ShardPlan, rank: int) -> "pd.DataFrame":
    """Every slice rank ``rank`` owns, in its local buffer order, one row each.

    Columns: ``bucket``, ``array`` (path), ``start``, ``stop`` (elements of the flattened array),
    ``elements`` (``stop - start``) and ``bytes`` (``elements`` times the array's itemsize). Empty
    slices (a rank past an array's end) are left out; padding is not a slice.

    Raises:
        ValueError: on a rank out of range (from :meth:`ShardPlan.rank_slices`).
    """
    import pandas as pd

    spec = plan.buckets.spec
    itemsize = {p.path: int(k) for p, k in zip(spec.params, spec.itemsizes)}
    rows = [{"bucket": s.bucket, "array": s.path, "start": s.start, "stop": s.stop, "elements": s.stop - s.start,
             "bytes": (s.stop - s.start) * itemsize[s.path]}
            for s in plan.rank_slices(rank) if s.stop > s.start]
    return pd.DataFrame(rows, columns=["bucket", "array", "start", "stop", "elements", "bytes"])


def rank_summary(plan: ShardPlan, rank: int, table: "pd.DataFrame | None" = None) -> str:
    """One line: how many slices in how many buckets, the bytes owned, and the padding, of one rank."""
    table = rank_slices_table(plan, rank) if table is None else table
    return (f"rank {rank} of {plan.num_shards} ({plan.layout}): {len(table):,} slices in {table.bucket.nunique():,} of "
            f"{plan.buckets.num_buckets:,} buckets, {format_bytes(int(table.bytes.sum()))} owned + "
            f"{format_bytes(int(plan.rank_padding_bytes[rank]))} padding")


def rank_inspector_html(plan: ShardPlan, rank: int) -> str:
    """The summary line and every slice (at most :data:`MAX_HTML_ROWS`) as an HTML table that scrolls past
    :data:`VISIBLE_ROWS` rows."""
    table = rank_slices_table(plan, rank)
    more = len(table) - MAX_HTML_ROWS
    head = "".join(f"<th style='text-align:{a};padding:2px 10px'>{h}</th>" for h, a in
                   (("bucket", "right"), ("array", "left"), ("elements [start, stop)", "left"), ("bytes", "right")))
    body = "".join(
        f"<tr><td style='text-align:right;padding:1px 10px'>{r.bucket}</td>"
        f"<td style='padding:1px 10px'>{html.escape(r.array)}</td>"
        f"<td style='padding:1px 10px'>[{r.start:,}, {r.stop:,})</td>"
        f"<td style='text-align:right;padding:1px 10px'>{format_bytes(int(r.bytes))}</td></tr>"
        for r in table.iloc[:MAX_HTML_ROWS].itertuples())
    if more > 0:
        body += (f"<tr><td colspan='4' style='padding:1px 10px'><i>… and {more:,} more slices: "
                 f"rank_slices_table(plan, {rank}) lists every one</i></td></tr>")
    return (f"<div class='workbench-rank-inspector'><b>{html.escape(rank_summary(plan, rank, table))}</b>"
            f"<div style='max-height:{22 * (VISIBLE_ROWS + 1)}px;overflow-y:auto;border:1px solid #E8EEF5'>"
            f"<table style='border-collapse:collapse;font-size:12px'><thead style='background:#E8EEF5'>"
            f"<tr>{head}</tr></thead><tbody>{body}</tbody></table></div></div>")

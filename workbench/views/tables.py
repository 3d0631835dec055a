"""Tables a person reads: any table formatted (:func:`readable_table`), the layouts compared
(:func:`layouts_table`), and tables for live widgets as HTML, from the same columns as the static table figures.

A plotly table measures its text when drawn; a FigureWidget draws before JupyterLab has laid it
out, so an explorer's table came up blank or with its header lines out of their cells (issue 18).
An HTML table is laid out by the browser: sized to its content, every row shown.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Mapping, Sequence

from workbench.core.shards import ShardPlan
from workbench.core.units import BYTE_UNITS, byte_unit, format_column, format_seconds
from workbench.views.plans import COLLECTIVE_ABBREVIATIONS, METRIC_COLUMNS

if TYPE_CHECKING:
    import pandas as pd

#: Columns a table a person reads may have: more ran off the page at 1440 px (11-16 columns, issue 29).
MAX_COLUMNS = 8
#: The layouts-compared table's columns (``ShardPlan.summary`` keys), in reading order.
LAYOUT_COLUMNS = ("num_shards", "num_buckets", "max_rank_bytes", "imbalance", "padding_bytes", "num_split_arrays",
                  "max_fragments_per_rank", "num_collectives_per_step")


def readable_table(table: "pd.DataFrame", *, columns: Sequence[str] | None = None, unit: str | None = None,
                   max_columns: int = MAX_COLUMNS) -> "pd.DataFrame":
    """``table`` as a person reads it, every cell a string: ``*_bytes`` columns in one binary unit for the
    whole table (``unit``, default MiB beside ``*_mib`` columns, else the largest value's; the header says it:
    ``max rank (MiB)``), ``*_s``
    columns as times (``25.6 s``), other numbers with thousands separators or to 3 significant digits
    (:func:`~workbench.core.units.format_number`), None and NaN as ``–``; headers in words (``num_`` and
    underscores dropped).

    Args:
        table: Any DataFrame (its index is kept, formatted likewise).
        columns: The columns to show, in order (default: all).
        unit: A key of :data:`~workbench.core.units.BYTE_UNITS` for every ``*_bytes`` column.
        max_columns: The most columns the page holds.

    Raises:
        ValueError: more than ``max_columns`` columns (naming them: pass ``columns=``), an unknown
            column or unit.
    """
    import pandas as pd

    columns = list(table.columns if columns is None else columns)
    if missing := [c for c in columns if c not in table.columns]:
        raise ValueError(f"columns: {missing} not in the table (it has {list(table.columns)}).")
    if len(columns) > max_columns:
        raise ValueError(f"columns: {len(columns)} do not fit a page (at most {max_columns}): choose among {columns}.")
    sizes = [c for c in columns if str(c).endswith("_bytes")]
    values = [abs(float(v)) for c in sizes for v in table[c] if _is_size(v) and v == v]
    mib = any(str(c).endswith("_mib") for c in columns)  # a table already in MiB keeps its sizes in MiB
    unit = unit or ("MiB" if mib else byte_unit(max(values, default=0)))
    if unit not in BYTE_UNITS:
        raise ValueError(f"unit: unknown {unit!r}; choose one of {', '.join(BYTE_UNITS)}.")

    def column(c) -> list[str]:
        if str(c).endswith("_bytes"):
            return format_column([v / BYTE_UNITS[unit] if _is_size(v) else v for v in table[c]])
        if str(c).endswith("_s") and not str(c).endswith("_per_s"):  # a time; "_per_s" is a rate
            return [format_seconds(v) for v in table[c]]
        return format_column(list(table[c]))

    if isinstance(table.index, pd.MultiIndex):  # each level formatted on its own, the levels kept
        index = pd.MultiIndex.from_arrays([format_column(list(table.index.get_level_values(k)))
                                           for k in range(table.index.nlevels)], names=table.index.names)
    else:
        index = pd.Index(format_column(list(table.index)), name=table.index.name)
    return pd.DataFrame({_header(c, unit): column(c) for c in columns}, index=index)


def _is_size(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) or hasattr(value, "dtype")


def _header(column, unit: str) -> str:
    name = str(column).removeprefix("num_")
    for suffix, label in (("_bytes", f" ({unit})"), ("_ms", " (ms)"), ("_mib", " (MiB)"), ("_gb_per_s", " (GB/s)"),
                          ("_us", " (µs)"), ("_s", "")):
        if name.endswith(suffix):
            name = name.removesuffix(suffix) + label
            break
    return name.replace("_", " ")


def layouts_table(plans: Mapping[str, ShardPlan]) -> "pd.DataFrame":
    """The layouts compared (``ShardPlan.summary`` of each, :data:`LAYOUT_COLUMNS`) as a person reads them:
    one row per layout, sizes in one unit, whole numbers in full, no more columns than fit."""
    import pandas as pd

    if not plans:
        raise ValueError("layouts_table needs at least one plan.")
    table = pd.DataFrame([plan.summary() for plan in plans.values()], index=pd.Index(list(plans), name="layout"))
    return readable_table(table, columns=LAYOUT_COLUMNS)


def layout_metrics_rows(plans: Mapping[str, ShardPlan]) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the layouts-compared table (:data:`~workbench.views.plans.METRIC_COLUMNS`), as
    :func:`~workbench.views.plans.fig_layout_metrics` shows them; ``<br>`` marks a line break."""
    if not plans:
        raise ValueError("layout_metrics_rows needs at least one plan.")
    header = ["layout"] + [name for name, _ in METRIC_COLUMNS]
    rows = [[label] + [cell(plan.summary(), plan) for _, cell in METRIC_COLUMNS] for label, plan in plans.items()]
    return header, rows


def layout_metrics_html(plans: Mapping[str, ShardPlan]) -> str:
    """The layouts-compared table as HTML, with its title; cells never wrap except at their ``<br>``."""
    header, rows = layout_metrics_rows(plans)
    esc = lambda text: "<br>".join(html.escape(part) for part in text.split("<br>"))  # noqa: E731
    cell = "padding:4px 8px;border:1px solid #D5DCE6;white-space:nowrap;vertical-align:top;text-align:left"
    head = "".join(f"<th style='{cell};background:#E8EEF5;font-weight:normal'>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td style='{cell}'>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    bp = next(iter(plans.values())).buckets
    title = f"Layouts compared: {bp.spec.name}, {bp.num_buckets} buckets (policy {bp.policy.name})"
    return (f"<div class='workbench-layout-metrics'><div style='font-size:14px;margin:8px 0'>{html.escape(title)}"
            f"<br><small>collectives: {COLLECTIVE_ABBREVIATIONS}</small></div>"
            f"<table style='border-collapse:collapse;font-size:12px'><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table></div>")


def worst_rows(table: "pd.DataFrame", by: list[str]) -> "pd.DataFrame":
    """One row per ``by`` group with its ``error`` (|ratio - 1|): the worst of the rows held to a target, or of all
    where none is (a store can mix runs whose JAX peak is XLA's plan, shown only, with runs that read the truth:
    the plan's error is not the group's miss)."""
    t = table.assign(error=(table.ratio - 1).abs(), held=table.tolerance.notna())
    t = t.sort_values(["held", "error"], ascending=False, kind="stable")
    return t.drop_duplicates(by).drop(columns="held")

"""Tables for live widgets as HTML, from the same columns as the static table figures.

A plotly table measures its text when drawn; a FigureWidget draws before JupyterLab has laid it
out, so an explorer's table came up blank or with its header lines out of their cells (issue 18).
An HTML table is laid out by the browser: sized to its content, every row shown.
"""

from __future__ import annotations

import html
from typing import Mapping

from workbench.core.shards import ShardPlan
from workbench.views.plans import COLLECTIVE_ABBREVIATIONS, METRIC_COLUMNS


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

"""Interactive explorer of bucket sizes and shard layouts.

Widgets only wire controls to the planners (:func:`~workbench.core.buckets.plan_buckets`,
:func:`~workbench.core.shards.plan_shards`) and to the ``fig_*`` functions of
:mod:`workbench.views.plans`; they compute nothing themselves, so every number on
screen comes from a call a test can repeat.
"""

from __future__ import annotations

import html
from collections import OrderedDict
from typing import Callable, Mapping

import ipywidgets as widgets

from workbench.core.buckets import POLICIES, BucketPlan, plan_buckets
from workbench.core.checks import integer
from workbench.core.param_kinds import PARAM_KINDS
from workbench.core.shards import LAYOUTS, ShardPlan, plan_shards
from workbench.core.specs import ModelSpec
from workbench.core.units import MiB, format_bytes, format_seconds
from workbench.estimate.comm import AlphaBeta, estimate_comm
from workbench.views.explorer_tools import ExplorerTools
from workbench.views.figure_widget import FigureWidget
from workbench.views.plans import fig_bucket_layout
from workbench.views.rank_inspector import rank_inspector_html
from workbench.views.shard_map import MAX_ARRAY_GROUPS, fig_rank_load, fig_shard_map
from workbench.views.style import TEMPLATE
from workbench.views.widget_sync import (WidthProbe, busy, slider_layout, sync_figure_widget, undrawn_notice,
                                        watch_drawn, wrapping_row)
from workbench.views.tables import layout_metrics_html

#: Choices of the sliders: ``communication_size`` in bytes, 0 (one bucket per array) then 1 MiB to 256 MiB;
#: ``num_shards``, powers of two from 1 to 1024.
COMMUNICATION_SIZES, NUM_SHARDS = (0,) + tuple(2**k * MiB for k in range(9)), tuple(2**k for k in range(11))
#: The FigureWidgets of an explorer, by name.
FIGURES = ("bucket_layout", "shard_map", "rank_load")
#: Trace slots a figure widget reserves on its first draw (see :func:`~workbench.views.widget_sync.sync_figure_widget`):
#: the bucket layout has a bar trace per parameter kind present and up to two line/marker traces, so another
#: model is one ``Plotly.update`` rather than a replacement of every trace (three redraws); the shard map has
#: up to one bar trace per array group and one of padding in each of its two subplots.
SLOTS = {"bucket_layout": (("bar", len(PARAM_KINDS)), ("scatter", 2)), "shard_map": (("bar", 2 * (MAX_ARRAY_GROUPS + 1)),)}
#: Width of an explorer's figures in pixels until the browser reports the notebook's (:class:`WidthProbe`):
#: JupyterLab's output area at a 1400 px window is 968 px, and a FigureWidget drawn before it is attached
#: otherwise keeps plotly's default 700 px. A stored page, with no kernel, keeps it.
FIGURE_WIDTH = 940
#: Links the cost line can assume (Hockney alpha-beta: latency per ring step, bandwidth per rank). These are
#: round, typical figures, not measurements: fit your own with :func:`workbench.estimate.comm.fit_alpha_beta`.
LINKS = {"NVLink (5 µs, 100 GB/s)": AlphaBeta(5e-6, 100e9), "InfiniBand 200 Gb/s (10 µs, 20 GB/s)": AlphaBeta(10e-6, 20e9),
         "Ethernet 10 Gb/s (50 µs, 1.1 GB/s)": AlphaBeta(50e-6, 1.1e9)}
#: Plans and figures an explorer keeps (least recently used dropped): going back to a setting costs nothing.
MEMO_SIZE = 64


def _size_label(num_bytes: int) -> str:
    if num_bytes == 0:
        return "per array"  # the readout's room: "0 (per array)" ran into the next label
    return f"{num_bytes // MiB} MiB" if num_bytes % MiB == 0 else format_bytes(num_bytes)


class LayoutExplorer(ExplorerTools, widgets.VBox):
    """Controls, figures, a rank inspector, a cost line and the code of the current view; see
    :func:`build_layout_explorer`.

    Attributes:
        controls: ``{name: widget}``: ``model``, ``communication_size`` (bytes),
            ``num_shards``, ``layout``, ``pad_rows``, ``policy``, ``bucket``, ``rank``, ``link``.
        figures: ``{name: FigureWidget}`` for :data:`FIGURES`.
        status: An HTML line: the current plan, or the error that kept the last figures.
        cost: An HTML line: collectives per step and their predicted time on the chosen link
            (:func:`~workbench.estimate.comm.estimate_comm`), beside the bytes.
        inspector: HTML: every slice the chosen rank holds (:mod:`workbench.views.rank_inspector`).
        metrics: HTML: the layouts compared (:func:`workbench.views.tables.layout_metrics_html`).
        code: HTML: the one call that reproduces this view. Export and pin: :class:`ExplorerTools`.
        bucket_plan: The bucket plan on screen (``None`` before the first success).
        shard_plans: ``{layout: ShardPlan}`` on screen, the chosen layout first.
    """

    def __init__(self, spec_or_preset: ModelSpec | str, communication_size: int, num_shards: int, layout: str,
                 policy: str, pad_rows: bool = False, bucket: int = 0, rank: int = 0) -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"Unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}.")
        if policy not in POLICIES:
            raise ValueError(f"Unknown bucket policy {policy!r}; known policies: {', '.join(POLICIES)}.")
        num_shards = integer("num_shards", num_shards, low=1)
        communication_size = integer("communication_size (bytes)", communication_size, low=0)
        bucket, rank = integer("bucket", bucket, low=0), integer("rank", rank, low=0)
        super().__init__()
        self.add_class("workbench-layout-explorer")  # for browser tests and user CSS
        from workbench.core import presets

        self._specs: dict[str, ModelSpec] = {}
        if not isinstance(spec_or_preset, (ModelSpec, str)) or (
                isinstance(spec_or_preset, str) and spec_or_preset not in presets.PRESETS):
            from workbench.core.resolve import resolve_spec  # a config.json path or dict: its shapes

            spec_or_preset = resolve_spec(spec_or_preset, argument="spec_or_preset")
        models: list[tuple[str, ModelSpec | str]] = [(name, name) for name in presets.list_presets()]
        if isinstance(spec_or_preset, ModelSpec):
            models.insert(0, (f"{spec_or_preset.name} (given)", spec_or_preset))
        else:
            self._spec(spec_or_preset)  # an unknown name raises here, naming the known ones
        sizes = sorted(set(COMMUNICATION_SIZES) | {communication_size})
        shards = sorted(set(NUM_SHARDS) | {num_shards})
        wide = dict(style={"description_width": "initial"})
        self.controls: dict[str, widgets.Widget] = {
            "model": widgets.Dropdown(options=models, value=spec_or_preset, description="model", **wide),
            "policy": widgets.Dropdown(options=list(POLICIES), value=policy, description="policy", **wide),
            "communication_size": widgets.SelectionSlider(
                options=[(_size_label(s), s) for s in sizes], value=communication_size,
                description="communication_size", continuous_update=False, layout=slider_layout(), **wide),
            "num_shards": widgets.SelectionSlider(
                options=[(str(n), n) for n in shards], value=num_shards, description="num_shards (N)",
                continuous_update=False, layout=slider_layout(), **wide),
            # Three fixed-width buttons on one line (they wrapped, leaving "greedy" alone on a row).
            "layout": widgets.ToggleButtons(options=list(LAYOUTS), value=layout, description="layout",
                                            style={"description_width": "initial", "button_width": "72px"},
                                            layout=widgets.Layout(width="auto", flex="0 0 auto")),
            "pad_rows": widgets.Checkbox(value=pad_rows, description="pad_rows (row layout)", indent=False),
            # Typed fields: a slider's 77 px track could not pick one of 800 buckets or 1024 ranks.
            "bucket": widgets.BoundedIntText(value=0, min=0, max=0, step=1, description="bucket (shard map)",
                                             layout=widgets.Layout(width="220px", margin="2px 16px 2px 0"), **wide),
            "rank": widgets.BoundedIntText(value=0, min=0, max=0, step=1, description="rank (inspector)",
                                           layout=widgets.Layout(width="220px", margin="2px 16px 2px 0"), **wide),
            "link": widgets.Dropdown(options=list(LINKS), value=next(iter(LINKS)), description="link (cost)",
                                     layout=widgets.Layout(width="360px"), **wide),
        }
        self.figures: dict[str, FigureWidget] = {
            name: watch_drawn(FigureWidget(layout=dict(template=TEMPLATE, width=FIGURE_WIDTH))) for name in FIGURES
        }
        self.status, self.cost, self.code = (widgets.HTML() for _ in range(3))
        # A table wider than the notebook scrolls sideways rather than losing its right columns.
        self.inspector, self.metrics = (widgets.HTML(layout=widgets.Layout(overflow="auto")) for _ in range(2))
        self.probe = WidthProbe()  # the figures follow the notebook's width
        self.bucket_plan: BucketPlan | None = None
        self.shard_plans: dict[str, ShardPlan] = {}
        self._shown: dict[str, dict | None] = {name: None for name in FIGURES}  # what each FigureWidget holds
        self._memo: OrderedDict[tuple, object] = OrderedDict()
        self._syncing = False
        self._wanted = dict(bucket=bucket, rank=rank)
        c = self.controls
        self.children = [
            self.probe, self._tools_row(), self.pinned_label, wrapping_row([c["model"], c["policy"]]),
            wrapping_row([c["layout"], c["pad_rows"]], align_items="center"),
            wrapping_row([c["communication_size"], c["num_shards"]]),
            wrapping_row([c["bucket"], c["rank"], c["link"]]),
            self.status, self.cost, self.code,
            *(self.figure_row(name) for name in FIGURES[:2]), self.inspector, self.metrics, self.figure_row("rank_load"),
        ]
        for control in c.values():
            control.observe(self._on_change, names="value")
        self.probe.observe(self._on_change, names=["width", "checks"])
        self.update()

    def _spec(self, model: ModelSpec | str) -> ModelSpec:
        if isinstance(model, ModelSpec):
            return model
        if model not in self._specs:
            from workbench.core import presets

            self._specs[model] = presets.get_preset(model)
        return self._specs[model]

    def _on_change(self, change: Mapping) -> None:
        if not self._syncing:
            self.update()

    def _memoised(self, key: tuple, make: Callable[[], object]):
        """``make()``, kept under ``key`` (plans and figures are pure functions of the controls that key them)."""
        if key in self._memo:
            self._memo.move_to_end(key)
            return self._memo[key]
        value = self._memo[key] = make()  # a ValueError propagates, and nothing is kept
        if len(self._memo) > MEMO_SIZE:
            self._memo.popitem(last=False)
        return value

    def _plan_layouts(self, bucket_plan: BucketPlan, values: Mapping,
                      bucket_key: tuple) -> tuple[dict[str, ShardPlan], list[str]]:
        """The chosen layout (its ValueError propagates), then the others that plan, with why any did not."""
        chosen = values["layout"]
        compared = "row" if chosen == "flat" else "flat"
        plans, notes = {}, []
        for name in [chosen, compared, *(name for name in LAYOUTS if name not in (chosen, compared))]:
            pad = dict(pad_rows=values["pad_rows"]) if name == "row" else {}
            try:
                plans[name] = self._memoised(
                    ("shards", *bucket_key, values["num_shards"], name, *pad.values()),
                    lambda name=name, pad=pad: plan_shards(bucket_plan, values["num_shards"], name, **pad))
            except ValueError as err:
                if name == chosen:
                    raise
                notes.append(f"{name} not shown: {err}")
        return plans, notes

    CODE_IMPORTS = "from workbench.core.units import MiB\nfrom workbench.views.widgets import build_layout_explorer"

    def shown_json(self) -> dict[str, dict | None]:
        return dict(self._shown)

    def view_parts(self) -> list[str]:
        """What an export's file names say of this view: model, size, N, layout."""
        v = {name: control.value for name, control in self.controls.items()}
        return ["layout", getattr(v["model"], "name", v["model"]), _size_label(v["communication_size"]),
                f"N{v['num_shards']}", v["layout"]]

    def code_line(self) -> str:
        """The call that reproduces this view (a given spec is named ``spec``)."""
        v = {name: control.value for name, control in self.controls.items()}
        model = "spec" if isinstance(v["model"], ModelSpec) else repr(v["model"])
        size = v["communication_size"]
        size_text = f"{size // MiB} * MiB" if size and size % MiB == 0 else str(size)
        return (f"build_layout_explorer({model}, communication_size={size_text}, num_shards={v['num_shards']}, "
                f"layout={v['layout']!r}, policy={v['policy']!r}, pad_rows={v['pad_rows']}, bucket={v['bucket']}, "
                f"rank={v['rank']})")

    def update(self) -> bool:
        """Recompute the plans and every figure from the controls, the explorer marked busy meanwhile
        (:func:`~workbench.views.widget_sync.busy`).

        Returns:
            ``True`` on success. On a ``ValueError`` (say a row layout of an array whose
            size N does not divide) the status line shows the message, the figures keep
            the last valid settings, and the result is ``False``.
        """
        with busy(self, self.status):
            return self._update()

    def _update(self) -> bool:
        values = {name: control.value for name, control in self.controls.items()}
        if self._wanted:  # the first draw: the bucket and rank asked for, once their maxima are known
            values.update(self._wanted)
        try:
            spec = self._spec(values["model"])
            # A given spec is keyed by identity: it is one object for the explorer's life (a dropdown option).
            model_key = values["model"] if isinstance(values["model"], str) else ("given", id(values["model"]))
            bucket_key = (model_key, values["communication_size"], values["policy"])
            bucket_plan = self._memoised(("buckets", *bucket_key), lambda: plan_buckets(
                spec, values["communication_size"], policy=values["policy"]))
            plans, notes = self._plan_layouts(bucket_plan, values, bucket_key)
            bucket = min(values["bucket"], bucket_plan.num_buckets - 1)
            rank = min(values["rank"], values["num_shards"] - 1)
            compared = dict(list(plans.items())[:2])
            chosen = plans[values["layout"]]
            plans_key = (*bucket_key, values["num_shards"], values["pad_rows"], *plans)  # the layouts, in order
            new = {
                "bucket_layout": self._memoised(("fig_bucket_layout", *bucket_key), lambda: fig_bucket_layout(bucket_plan)),
                "shard_map": self._memoised(("fig_shard_map", *plans_key, bucket, rank),
                                            lambda: fig_shard_map(compared, bucket, rank=rank)),
                "rank_load": self._memoised(("fig_rank_load", *plans_key), lambda: fig_rank_load(plans)),
            }
            comm = self._memoised(("comm", *plans_key), lambda: estimate_comm(
                chosen, "zero1" if chosen.layout == "greedy" else "fsdp"))
            inspector = self._memoised(("inspector", *plans_key, rank), lambda: rank_inspector_html(chosen, rank))
            metrics = self._memoised(("metrics", *plans_key), lambda: layout_metrics_html(plans))
        except ValueError as err:
            self.status.value = (f"<span style='color:#B00020'><b>Error:</b> {html.escape(str(err))}</span> "
                                 "<i>(figures show the last valid settings)</i>")
            return False
        self._wanted = {}
        for name, fig in new.items():
            fig.layout.width = self.figure_width(FIGURE_WIDTH)
            self._shown[name] = sync_figure_widget(self.figures[name], fig, self._shown[name], SLOTS.get(name, ()))
        self.bucket_plan, self.shard_plans = bucket_plan, plans
        self._syncing = True
        try:
            for name, top, value in (("bucket", bucket_plan.num_buckets - 1, bucket), ("rank", chosen.num_shards - 1, rank)):
                self.controls[name].max = top
                self.controls[name].value = value
        finally:
            self._syncing = False
        self.status.value = html.escape(
            f"{spec.name}: {bucket_plan.num_buckets} buckets, {values['layout']} over N={chosen.num_shards}: "
            f"max {format_bytes(chosen.rank_bytes.max())} per rank, imbalance {chosen.imbalance:.3f}, "
            f"{chosen.num_collectives_per_step} collectives per step" + "".join(f". {note}" for note in notes)
        ) + undrawn_notice(self.probe, self.figures)
        link_name = values["link"]
        kinds = ", ".join(f"{c.num_collectives} {c.kind.replace('_', '-')}" for c in comm.collectives)
        self.cost.value = html.escape(
            f"cost ({comm.strategy}, {link_name}): {comm.num_collectives} collectives per step ({kinds}), "
            f"{format_bytes(int(comm.rank_bytes))} sent per rank, about "
            f"{format_seconds(comm.predict_s(LINKS[link_name]))} of communication per step if none overlaps")
        self.inspector.value, self.metrics.value = inspector, metrics
        self.code.value = f"<code style='user-select:all'>{html.escape(self.code_line())}</code>"
        return True


def build_layout_explorer(spec_or_preset: ModelSpec | str = "tiny-llama", communication_size: int = 32 * MiB,
                          num_shards: int = 8, layout: str = "row", policy: str = "mlx", *, pad_rows: bool = False,
                          bucket: int = 0, rank: int = 0) -> LayoutExplorer:
    """An explorer of bucket sizes and shard layouts for one model.

    Controls: the model (the presets of :mod:`workbench.core.presets`, plus ``spec_or_preset``
    when it is a :class:`~workbench.core.specs.ModelSpec`, e.g. from ``spec_from_mlx``,
    ``spec_from_nnx`` or a config), ``communication_size`` (0 and 1 to 256 MiB, doubling),
    ``num_shards`` (1 to 1024, doubling), the layout, ``pad_rows``, the bucket policy, the
    bucket drawn in the shard map, the rank inspected, and the link the cost line assumes.
    Shown: the bucket layout, the shard map of the chosen layout beside flat (or row, when flat
    is chosen), every slice the chosen rank holds, the bytes per rank, the metrics table of
    every layout that plans, the predicted collectives and communication time, and the call
    that reproduces the view (:meth:`LayoutExplorer.code_line`).

    Args:
        spec_or_preset: A spec, or a preset name (e.g. ``"llama-3-8b"``).
        communication_size: Initial bucket cap in bytes (``0``: one bucket per array). Default: 32 MiB.
        num_shards: Initial N. Default: 8.
        layout: ``"row"``, ``"flat"`` or ``"greedy"``.
        policy: A bucket policy name (``"mlx"`` or ``"pytorch-ddp"``).
        pad_rows: Row layout only: pad each array to a multiple of N rows.
        bucket: The bucket of the shard map (clamped to the last bucket).
        rank: The rank drawn and inspected (clamped to N - 1).

    Returns:
        A :class:`LayoutExplorer` (an ``ipywidgets.VBox``); ``.export(folder)`` saves the view, ``.pin()`` keeps it.

    Raises:
        ValueError: on an unknown preset, layout or policy, or a bad N, cap, bucket or rank.
    """
    return LayoutExplorer(spec_or_preset, communication_size, num_shards, layout, policy, pad_rows, bucket, rank)

"""Interactive explorer of bucket sizes and shard layouts.

Widgets only wire controls to the planners (:func:`~workbench.core.buckets.plan_buckets`,
:func:`~workbench.core.shards.plan_shards`) and to the ``fig_*`` functions of
:mod:`workbench.views.plans`; they compute nothing themselves, so every number on
screen comes from a call a test can repeat.
"""

from __future__ import annotations

import html
from typing import Mapping

import ipywidgets as widgets
import plotly.graph_objects as go

from workbench.core.buckets import POLICIES, BucketPlan, plan_buckets
from workbench.core.shards import LAYOUTS, ShardPlan, plan_shards
from workbench.core.specs import ModelSpec
from workbench.core.units import MiB, format_bytes
from workbench.views.plans import fig_bucket_layout, fig_layout_metrics
from workbench.views.shard_map import fig_rank_load, fig_shard_map
from workbench.views.style import TEMPLATE, update_figure_widget

#: Choices of the ``communication_size`` slider, in bytes: 0 (one bucket per array), then 1 MiB to 256 MiB.
COMMUNICATION_SIZES = (0,) + tuple(2**k * MiB for k in range(9))
#: Choices of the ``num_shards`` slider: powers of two from 1 to 1024.
NUM_SHARDS = tuple(2**k for k in range(11))
#: The FigureWidgets of an explorer, by name.
FIGURES = ("bucket_layout", "shard_map", "metrics", "rank_load")


def _size_label(num_bytes: int) -> str:
    if num_bytes == 0:
        return "0 (per array)"
    return f"{num_bytes // MiB} MiB" if num_bytes % MiB == 0 else format_bytes(num_bytes)


class LayoutExplorer(widgets.VBox):
    """Controls, figures and a status line; see :func:`build_layout_explorer`.

    Attributes:
        controls: ``{name: widget}``: ``model``, ``communication_size`` (bytes),
            ``num_shards``, ``layout``, ``pad_rows``, ``policy``, ``bucket``.
        figures: ``{name: FigureWidget}`` for :data:`FIGURES`.
        status: An HTML line: the current plan, or the error that kept the last figures.
        bucket_plan: The bucket plan on screen (``None`` before the first success).
        shard_plans: ``{layout: ShardPlan}`` on screen, the chosen layout first.
    """

    def __init__(self, spec_or_preset: ModelSpec | str, communication_size: int, num_shards: int, layout: str,
                 policy: str) -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"Unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}.")
        if policy not in POLICIES:
            raise ValueError(f"Unknown bucket policy {policy!r}; known policies: {', '.join(POLICIES)}.")
        if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
            raise ValueError(f"num_shards must be an integer >= 1, got {num_shards!r}.")
        if isinstance(communication_size, bool) or not isinstance(communication_size, int) or communication_size < 0:
            raise ValueError(f"communication_size must be an integer number of bytes >= 0, got {communication_size!r}.")
        super().__init__()
        from workbench.core import presets

        self._specs: dict[str, ModelSpec] = {}
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
                description="communication_size", continuous_update=False, layout=widgets.Layout(width="420px"), **wide),
            "num_shards": widgets.SelectionSlider(
                options=[(str(n), n) for n in shards], value=num_shards, description="num_shards (N)",
                continuous_update=False, layout=widgets.Layout(width="420px"), **wide),
            "layout": widgets.ToggleButtons(options=list(LAYOUTS), value=layout, description="layout", **wide),
            "pad_rows": widgets.Checkbox(value=False, description="pad_rows (row layout)", indent=False),
            "bucket": widgets.IntSlider(value=0, min=0, max=0, description="bucket (shard map)",
                                        continuous_update=False, **wide),
        }
        self.figures: dict[str, go.FigureWidget] = {
            name: go.FigureWidget(layout=dict(template=TEMPLATE)) for name in FIGURES
        }
        self.status = widgets.HTML()
        self.bucket_plan: BucketPlan | None = None
        self.shard_plans: dict[str, ShardPlan] = {}
        self._layout_keys: dict[str, set[str]] = {name: set() for name in FIGURES}
        self._syncing = False
        c = self.controls
        self.children = [
            widgets.HBox([c["model"], c["policy"], c["layout"]]),
            widgets.HBox([c["communication_size"], c["num_shards"]]),
            widgets.HBox([c["bucket"], c["pad_rows"]]),
            self.status,
            *(self.figures[name] for name in FIGURES),
        ]
        for control in c.values():
            control.observe(self._on_change, names="value")
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

    def _plan_layouts(self, bucket_plan: BucketPlan, values: Mapping) -> tuple[dict[str, ShardPlan], list[str]]:
        """The chosen layout (its ValueError propagates), then the others that plan, with why any did not."""
        chosen = values["layout"]
        compared = "row" if chosen == "flat" else "flat"
        plans, notes = {}, []
        for name in [chosen, compared, *(name for name in LAYOUTS if name not in (chosen, compared))]:
            pad = dict(pad_rows=values["pad_rows"]) if name == "row" else {}
            try:
                plans[name] = plan_shards(bucket_plan, values["num_shards"], name, **pad)
            except ValueError as err:
                if name == chosen:
                    raise
                notes.append(f"{name} not shown: {err}")
        return plans, notes

    def update(self) -> bool:
        """Recompute the plans and every figure from the controls.

        Returns:
            ``True`` on success. On a ``ValueError`` (say a row layout of an array whose
            size N does not divide) the status line shows the message, the figures keep
            the last valid settings, and the result is ``False``.
        """
        values = {name: control.value for name, control in self.controls.items()}
        try:
            spec = self._spec(values["model"])
            bucket_plan = plan_buckets(spec, values["communication_size"], policy=values["policy"])
            plans, notes = self._plan_layouts(bucket_plan, values)
            bucket = min(values["bucket"], bucket_plan.num_buckets - 1)
            compared = dict(list(plans.items())[:2])
            new = {
                "bucket_layout": fig_bucket_layout(bucket_plan),
                "shard_map": fig_shard_map(compared, bucket),
                "rank_load": fig_rank_load(plans),
                "metrics": fig_layout_metrics(plans),
            }
        except ValueError as err:
            self.status.value = (f"<span style='color:#B00020'><b>Error:</b> {html.escape(str(err))}</span> "
                                 "<i>(figures show the last valid settings)</i>")
            return False
        for name, fig in new.items():
            self._layout_keys[name] = update_figure_widget(self.figures[name], fig, self._layout_keys[name])
        self.bucket_plan, self.shard_plans = bucket_plan, plans
        self._syncing = True
        try:
            self.controls["bucket"].max = bucket_plan.num_buckets - 1
            self.controls["bucket"].value = bucket
        finally:
            self._syncing = False
        chosen = plans[values["layout"]]
        self.status.value = html.escape(
            f"{spec.name}: {bucket_plan.num_buckets} buckets, {values['layout']} over N={chosen.num_shards}: "
            f"max {format_bytes(chosen.rank_bytes.max())} per rank, imbalance {chosen.imbalance:.3f}, "
            f"{chosen.num_collectives_per_step} collectives per step" + "".join(f". {note}" for note in notes)
        )
        return True


def build_layout_explorer(
    spec_or_preset: ModelSpec | str = "tiny-llama",
    communication_size: int = 32 * MiB,
    num_shards: int = 8,
    layout: str = "row",
    policy: str = "mlx",
) -> LayoutExplorer:
    """An explorer of bucket sizes and shard layouts for one model.

    Controls: the model (the presets of :mod:`workbench.core.presets`, plus ``spec_or_preset``
    when it is a :class:`~workbench.core.specs.ModelSpec`), ``communication_size`` (0 and 1 to
    256 MiB, doubling), ``num_shards`` (1 to 1024, doubling), the layout, ``pad_rows``,
    the bucket policy and the bucket drawn in the shard map. Figures: the bucket layout,
    the shard map of the chosen layout beside flat (or row, when flat is chosen), the
    bytes per rank and the metrics table of every layout that plans.

    Args:
        spec_or_preset: A spec, or a preset name (e.g. ``"llama-3-8b"``).
        communication_size: Initial bucket cap in bytes (``0``: one bucket per array). Default: 32 MiB.
        num_shards: Initial N. Default: 8.
        layout: ``"row"``, ``"flat"`` or ``"greedy"``.
        policy: A bucket policy name (``"mlx"`` or ``"pytorch-ddp"``).

    Returns:
        A :class:`LayoutExplorer` (an ``ipywidgets.VBox``) with ``.controls``,
        ``.figures``, ``.status`` and ``.update()``.

    Raises:
        ValueError: on an unknown preset, layout or policy, or a bad N or cap.
    """
    return LayoutExplorer(spec_or_preset, communication_size, num_shards, layout, policy)

"""The memory explorer: controls wired to :func:`~workbench.estimate.grid.estimate_breakdowns` and the
breakdown figure, for a preset or a user's config (notebook 03), against the memory of a device the user
picks: a capacity line, which strategies do not fit, and the largest micro-batch that fits each."""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING, Sequence

import ipywidgets as widgets

from workbench.core.units import format_number, format_params
from workbench.estimate.breakdown import MemoryEstimate
from workbench.estimate.knobs import OPTIMIZER_NUM_STATES, UPDATE_COPIES
from workbench.estimate.grid import POWERS_OF_TWO, estimate_breakdowns, powers_between
from workbench.views.explorer_tools import ExplorerTools
from workbench.views.figure_widget import FigureWidget
from workbench.views.memory import UNITS, breakdown_summary, fig_memory_breakdown, over_capacity
from workbench.views.style import TEMPLATE
from workbench.views.widget_sync import (WidthProbe, busy, slider_layout, sync_figure_widget, undrawn_notice,
                                        watch_drawn, wrapping_row)
from workbench.views.widgets import FIGURE_WIDTH

if TYPE_CHECKING:
    from workbench.core.resolve import ModelArg

#: The explorer's dropdowns and sliders: control -> options (a given value joins a slider's options).
EXPLORER_CHOICES = {"param_dtype": ("bfloat16", "float16", "float32"), "master_dtype": ("none", "float32"),
                    "optimizer": tuple(OPTIMIZER_NUM_STATES), "update_copies": UPDATE_COPIES}


#: The activation levers the explorer offers as checkboxes (:func:`~workbench.estimate.activations.estimate_activation_bytes`).
LEVERS = {"recompute": "recompute activations (full)", "fused_attention": "fused attention (no s×s scores)"}
EXPLORER_SLIDERS = {"micro_batch_size": POWERS_OF_TWO[:7], "seq_len": tuple(2**k for k in range(7, 16))}

#: Device memories the explorer offers, in GB (10**9 bytes, the unit of its figure): common accelerator sizes.
DEVICE_MEMORY_GB = (16, 24, 32, 40, 48, 64, 80, 96, 128, 141, 192, 288)
DEFAULT_DEVICE_MEMORY_GB = 80


def largest_micro_batch(estimate: MemoryEstimate, micro_batch_size: int, capacity_bytes: float) -> int | None:
    """The largest micro-batch (sequences per rank) whose peak fits ``capacity_bytes``, from an estimate at
    ``micro_batch_size``: activations grow linearly with it (:func:`~workbench.estimate.activations.estimate_activation_bytes`)
    and are the one row that does, in the backward phase; the peak is the states plus the larger transient phase.

    Returns:
        0 when even one sequence does not fit; ``None`` when the estimate counts no activations (any size fits,
        as far as it knows) and the rest fits.
    """
    per_sequence = estimate["activations"] / micro_batch_size
    room = capacity_bytes - estimate.phase_bytes("states")
    if room < estimate.phase_bytes("step") or room < estimate.phase_bytes("backward") - estimate["activations"]:
        return 0
    if per_sequence == 0:
        return None
    return int(math.floor((room - (estimate.phase_bytes("backward") - estimate["activations"])) / per_sequence))


def capacity_html(estimates: Sequence[MemoryEstimate], micro_batch_size: int, capacity_bytes: float) -> str:
    """The capacity line: at the largest N, the largest micro-batch that fits per strategy, and a warning
    naming every strategy whose peak exceeds the device (with how many times over)."""
    unit, n = UNITS["GB"], max(e.num_shards for e in estimates)
    cap = f"{format_number(capacity_bytes / unit)} GB"
    fits = [(e.strategy, largest_micro_batch(e, micro_batch_size, capacity_bytes)) for e in estimates if e.num_shards == n]
    parts = ", ".join(f"{s} {'any' if b is None else format_number(b) if b else 'none'}" for s, b in fits)
    over = over_capacity([e for e in estimates if e.num_shards == n], capacity_bytes)
    warn = ("" if not over else "<br><span style='color:#B00020'><b>Does not fit</b> on " + cap + " at N=" + str(n) + ": " +
            "; ".join(f"{e.strategy} needs {format_number(e.total_bytes / unit)} GB per rank "
                      f"({format_number(e.total_bytes / capacity_bytes)}× the device)" for e in over) + "</span>")
    return html.escape(f"Largest micro-batch that fits {cap} at N={n}: {parts}") + warn


#: Whose memory the capacity line is (its legend entry: ``"device memory 80 GB"``, by
#: :func:`~workbench.views.memory.capacity_trace`).
CAPACITY_LABEL = "device memory"
#: Pixels a vertical N label needs beside the next; pixels of a figure's width that are not the plot
#: (its margins and the legend on the right).
LABEL_PX, NOT_PLOT_PX = 11, 280


def label_step(num_bars: int, per_strategy: int, width_px: int) -> int:
    """Every how many N the x axis labels: the smallest divisor of the N per strategy that leaves each label
    :data:`LABEL_PX`, so that every strategy labels the same N (plotly's own choice, every other category,
    labelled N=8, 32 under one strategy and N=16, 64 under the next)."""
    room = max(width_px - NOT_PLOT_PX, 1) / num_bars
    return next((k for k in range(1, per_strategy + 1) if per_strategy % k == 0 and room * k >= LABEL_PX),
                per_strategy)


def fig_memory_explorer(estimates: Sequence[MemoryEstimate], capacity_bytes: float, width_px: int):
    """:func:`~workbench.views.memory.fig_memory_breakdown` in GB with its dashed capacity line (``capacity_bytes``,
    named :data:`CAPACITY_LABEL` in the legend, where a label would sit on the bars), every N labelled on the axis
    (plotly skipped every other category, so the labels alternated between strategy groups; :func:`label_step` at
    ``width_px``), and each peak number centred on its own bar, in GB with thousands (they leaned onto the next bar
    and read "1.81e+06")."""
    per = len(estimates) / len({e.strategy for e in estimates})
    some = "" if per <= 3 else "<br>numbers at the largest N of each strategy; hover for the rest"
    fig = fig_memory_breakdown(estimates, unit="GB", title=(
        f"Memory per rank at the peak, {format_params(estimates[0].num_params)}<br><sup>solid: model states; "
        f"hatched: the transient phase that sets the peak (backward or step){some}</sup>"),
        capacity_bytes=capacity_bytes, capacity_label=CAPACITY_LABEL)
    top = max(e.num_shards for e in estimates)
    for trace in fig.data:
        if trace.name.startswith("peak"):  # one number per bar it sits on: all, or each strategy's largest N
            trace.text = [f"{format_number(y)} GB" if per <= 3 or n == f"N={top}" else ""
                          for y, n in zip(trace.y, trace.x[1])]
            trace.textposition = "top center"
    step = label_step(len(estimates), int(per), width_px)
    fig.layout.xaxis.update(tickmode="linear", tick0=0, dtick=step, tickangle=-90 if per > 3 else 0, tickfont=dict(size=10))
    return fig


class MemoryExplorer(ExplorerTools, widgets.VBox):
    """Controls, a breakdown FigureWidget and a status line; see :func:`build_memory_explorer`.

    Attributes:
        controls: ``{name: widget}``: ``model``, ``param_dtype``, ``master_dtype``, ``optimizer``,
            ``update_copies``, ``recompute``, ``fused_attention``, ``micro_batch_size``, ``seq_len``,
            ``num_shards`` (a range of powers of two), ``device_memory``.
        figure: The breakdown :class:`plotly.graph_objects.FigureWidget`; ``figures`` holds it by name.
        Export and pin: :class:`~workbench.views.explorer_tools.ExplorerTools`.
        status: An HTML line: the peaks on screen, or the error that kept the last figure.
        estimates: The estimates on screen.
    """

    def __init__(self, model: "ModelArg", num_shards: tuple[int, int], **values) -> None:
        super().__init__()
        self.add_class("workbench-memory-explorer")  # for browser tests and user CSS
        from workbench.core.presets import list_presets

        estimate_breakdowns(model, num_shards=powers_between(*num_shards)[:1], **values)  # a bad knob raises here
        # A dropdown's value None means "nothing selected" to ipywidgets (it drew a blank box after
        # "none" was picked), so the control holds the string "none" and update() maps it back.
        values = {**values, "master_dtype": "none" if values["master_dtype"] is None else values["master_dtype"]}
        for name, options in EXPLORER_CHOICES.items():
            if values[name] not in options:
                raise ValueError(f"{name} must be one of {list(options)} in the explorer, got {values[name]!r}.")
        wide = dict(style={"description_width": "initial"})
        models = [(name, name) for name in list_presets()]
        if not (isinstance(model, str) and model in dict(models)):  # a user's spec or config joins the presets
            models.insert(0, (f"{getattr(model, 'name', None) or 'your model'} (given)", model))
        self.controls: dict[str, widgets.Widget] = {
            "model": widgets.Dropdown(options=models, value=model, description="model", **wide),
            **{name: widgets.Dropdown(options=list(options), value=values[name], description=name, **wide)
               for name, options in EXPLORER_CHOICES.items()},
            **{name: widgets.Checkbox(value=values[name], description=label, indent=False)
               for name, label in LEVERS.items()},
            **{name: widgets.SelectionSlider(options=sorted({*options, values[name]}), value=values[name],
                                             description=name, continuous_update=False,
                                             layout=slider_layout(), **wide)
               for name, options in EXPLORER_SLIDERS.items()},
            "num_shards": widgets.SelectionRangeSlider(
                options=POWERS_OF_TWO, value=tuple(num_shards), description="num_shards (N)",
                continuous_update=False, layout=slider_layout(), **wide),
            "device_memory": widgets.Dropdown(options=[(f"{gb} GB", gb * UNITS["GB"]) for gb in DEVICE_MEMORY_GB],
                                              value=DEFAULT_DEVICE_MEMORY_GB * UNITS["GB"], description="device memory",
                                              **wide),
        }
        self.figures = {"memory_breakdown": watch_drawn(FigureWidget(layout=dict(template=TEMPLATE,
                                                                                      width=FIGURE_WIDTH)))}
        self.status, self.code, self.estimates, self._shown = widgets.HTML(), widgets.HTML(), [], None
        self.capacity, self.probe = widgets.HTML(), WidthProbe()  # the figure follows the notebook's width
        c = self.controls
        self.children = [self.probe, self._tools_row(), self.pinned_label,
                         wrapping_row([c["model"], c["param_dtype"], c["master_dtype"]]),
                         wrapping_row([c["optimizer"], c["update_copies"], c["device_memory"]]),
                         wrapping_row([c["recompute"], c["fused_attention"]]),
                         wrapping_row([c["micro_batch_size"], c["seq_len"], c["num_shards"]]),
                         self.status, self.capacity, self.code, self.figure_row("memory_breakdown")]
        for control in c.values():
            control.observe(lambda change: self.update(), names="value")
        self.probe.observe(lambda change: self.update(), names=["width", "checks"])
        self.update()

    CODE_IMPORTS = "from workbench.views.memory_explorer import build_memory_explorer"

    @property
    def figure(self) -> FigureWidget:
        """The live figure (a page that did not draw it may have had it replaced: :func:`~workbench.views.widget_sync.redraw_undrawn`)."""
        return self.figures["memory_breakdown"]

    def shown_json(self) -> dict[str, dict | None]:
        return {"memory_breakdown": self._shown}

    def view_parts(self) -> list[str]:
        """What an export's file names say of this view: model, the N range, micro-batch and sequence length."""
        v = {name: control.value for name, control in self.controls.items()}
        model = v["model"] if isinstance(v["model"], str) else getattr(v["model"], "name", None) or "given"
        low, high = v["num_shards"]
        return ["memory", model, f"N{low}-{high}", f"b{v['micro_batch_size']}", f"s{v['seq_len']}"]

    def code_line(self) -> str:
        """The call that reproduces this view (a given spec or config is named ``model``); the levers and the
        device memory only when not their defaults."""
        v = {name: control.value for name, control in self.controls.items()}
        for lever in LEVERS:
            if not v[lever]:
                del v[lever]
        model = repr(v.pop("model")) if isinstance(self.controls["model"].value, str) else "model"
        device = v.pop("device_memory")  # named only when not the default
        if device != DEFAULT_DEVICE_MEMORY_GB * UNITS["GB"]:
            v["device_memory_gb"] = int(device // UNITS["GB"])
        v["master_dtype"] = None if v["master_dtype"] == "none" else v["master_dtype"]
        return f"build_memory_explorer({model}, " + ", ".join(f"{k}={val!r}" for k, val in v.items()) + ")"

    def update(self) -> bool:
        """Recompute from the controls, marked busy meanwhile (:func:`~workbench.views.widget_sync.busy`); on a
        ``ValueError`` keep the last figure, show the error, return False."""
        with busy(self, self.status):
            v = {name: control.value for name, control in self.controls.items()}
            v["master_dtype"] = None if v["master_dtype"] == "none" else v["master_dtype"]
            capacity = v.pop("device_memory")
            try:
                estimates = estimate_breakdowns(v.pop("model"), num_shards=powers_between(*v.pop("num_shards")), **v)
                width = self.figure_width(FIGURE_WIDTH)
                fig = fig_memory_explorer(estimates, capacity, width)
            except ValueError as err:
                self.status.value = f"<span style='color:#B00020'><b>Error:</b> {html.escape(str(err))}</span>"
                return False
            fig.layout.width = width
            self._shown, self.estimates = sync_figure_widget(self.figure, fig, self._shown), estimates
            self.code.value = f"<code style='user-select:all'>{html.escape(self.code_line())}</code>"
            self.capacity.value = capacity_html(estimates, v["micro_batch_size"], capacity)
            note = "" if estimates[0]["activations"] else " (activations not counted: a ModelSpec holds shapes only)"
            self.status.value = html.escape(breakdown_summary(estimates) + note) + undrawn_notice(
                self.probe, {"memory breakdown": self.figure})
            return True


def build_memory_explorer(model: "ModelArg" = "llama-3-8b", *, num_shards: tuple[int, int] = (8, 64),
                          param_dtype: str = "bfloat16", master_dtype: str | None = "float32",
                          optimizer: str = "adamw", micro_batch_size: int = 1, seq_len: int = 2048,
                          update_copies: str = "none", recompute: bool = False, fused_attention: bool = False,
                          device_memory_gb: int = DEFAULT_DEVICE_MEMORY_GB) -> MemoryExplorer:
    """An explorer of per-rank memory for every strategy of :data:`EXPLORER_STRATEGIES` against N.

    Args:
        model: A preset name, a ``config.json`` path or dict, or a ModelSpec (``spec_from_mlx``,
            ``spec_from_nnx``; no activations). num_shards: ``(low, high)``, powers of two in 1..1024: every power between.
        param_dtype, master_dtype, optimizer, update_copies: As :func:`estimate_memory`.
        micro_batch_size: Sequences per rank. seq_len: Tokens per sequence.
        recompute, fused_attention: The activation levers (full recomputation; a fused attention kernel), as
            :func:`~workbench.estimate.activations.estimate_activation_bytes`.
        device_memory_gb: The device's memory in GB (10**9 bytes), one of :data:`DEVICE_MEMORY_GB`: the
            capacity line, the largest micro-batch that fits each strategy, and which do not fit.

    Raises:
        ValueError: naming the bad knob.
    """
    if device_memory_gb not in DEVICE_MEMORY_GB:
        raise ValueError(f"device_memory_gb must be one of {list(DEVICE_MEMORY_GB)}, got {device_memory_gb!r}.")
    explorer = MemoryExplorer(model, num_shards, param_dtype=param_dtype, master_dtype=master_dtype,
                              optimizer=optimizer, micro_batch_size=micro_batch_size, seq_len=seq_len,
                              update_copies=update_copies, recompute=recompute, fused_attention=fused_attention)
    explorer.controls["device_memory"].value = device_memory_gb * UNITS["GB"]
    return explorer

"""The memory explorer: controls wired to :func:`~workbench.estimate.grid.estimate_breakdowns` and the
breakdown figure, for a preset or a user's config (notebook 03)."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

import ipywidgets as widgets
import plotly.graph_objects as go

from workbench.estimate.knobs import OPTIMIZER_NUM_STATES, UPDATE_COPIES
from workbench.estimate.grid import POWERS_OF_TWO, estimate_breakdowns, powers_between
from workbench.views.memory import breakdown_summary, fig_memory_breakdown
from workbench.views.style import TEMPLATE
from workbench.views.widget_sync import sync_figure_widget
from workbench.views.widgets import FIGURE_WIDTH

if TYPE_CHECKING:
    from workbench.core.resolve import ModelArg

#: The explorer's dropdowns and sliders: control -> options (a given value joins a slider's options).
EXPLORER_CHOICES = {"param_dtype": ("bfloat16", "float16", "float32"), "master_dtype": ("none", "float32"),
                    "optimizer": tuple(OPTIMIZER_NUM_STATES), "update_copies": UPDATE_COPIES}


EXPLORER_SLIDERS = {"micro_batch_size": POWERS_OF_TWO[:7], "seq_len": tuple(2**k for k in range(7, 16))}


class MemoryExplorer(widgets.VBox):
    """Controls, a breakdown FigureWidget and a status line; see :func:`build_memory_explorer`.

    Attributes:
        controls: ``{name: widget}``: ``model``, ``param_dtype``, ``master_dtype``, ``optimizer``,
            ``update_copies``, ``micro_batch_size``, ``seq_len``, ``num_shards`` (a range of powers
            of two).
        figure: The breakdown :class:`plotly.graph_objects.FigureWidget`.
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
            **{name: widgets.SelectionSlider(options=sorted({*options, values[name]}), value=values[name],
                                             description=name, continuous_update=False, **wide)
               for name, options in EXPLORER_SLIDERS.items()},
            "num_shards": widgets.SelectionRangeSlider(
                options=POWERS_OF_TWO, value=tuple(num_shards), description="num_shards (N)",
                continuous_update=False, layout=widgets.Layout(width="460px"), **wide),
        }
        self.figure = go.FigureWidget(layout=dict(template=TEMPLATE, width=FIGURE_WIDTH))
        self.status, self.code, self.estimates, self._shown = widgets.HTML(), widgets.HTML(), [], None
        c = self.controls
        self.children = [widgets.HBox([c["model"], c["param_dtype"], c["master_dtype"]]),
                         widgets.HBox([c["optimizer"], c["update_copies"]]),
                         widgets.HBox([c["micro_batch_size"], c["seq_len"], c["num_shards"]]), self.status, self.code, self.figure]
        for control in c.values():
            control.observe(lambda change: self.update(), names="value")
        self.update()

    def code_line(self) -> str:
        """The call that reproduces this view (a given spec or config is named ``model``)."""
        v = {name: control.value for name, control in self.controls.items()}
        model = repr(v.pop("model")) if isinstance(self.controls["model"].value, str) else "model"
        v["master_dtype"] = None if v["master_dtype"] == "none" else v["master_dtype"]
        return f"build_memory_explorer({model}, " + ", ".join(f"{k}={val!r}" for k, val in v.items()) + ")"

    def update(self) -> bool:
        """Recompute from the controls; on a ``ValueError`` keep the last figure, show the error, return False."""
        v = {name: control.value for name, control in self.controls.items()}
        v["master_dtype"] = None if v["master_dtype"] == "none" else v["master_dtype"]
        try:
            estimates = estimate_breakdowns(v.pop("model"), num_shards=powers_between(*v.pop("num_shards")), **v)
            fig = fig_memory_breakdown(estimates)
        except ValueError as err:
            self.status.value = f"<span style='color:#B00020'><b>Error:</b> {html.escape(str(err))}</span>"
            return False
        fig.layout.width = FIGURE_WIDTH
        self._shown, self.estimates = sync_figure_widget(self.figure, fig, self._shown), estimates
        self.code.value = f"<code style='user-select:all'>{html.escape(self.code_line())}</code>"
        note = "" if estimates[0]["activations"] else " (activations not counted: a ModelSpec holds shapes only)"
        self.status.value = html.escape(breakdown_summary(estimates) + note)
        return True


def build_memory_explorer(model: "ModelArg" = "llama-3-8b", *, num_shards: tuple[int, int] = (8, 64),
                          param_dtype: str = "bfloat16", master_dtype: str | None = "float32",
                          optimizer: str = "adamw", micro_batch_size: int = 1, seq_len: int = 2048,
                          update_copies: str = "none") -> MemoryExplorer:
    """An explorer of per-rank memory for every strategy of :data:`EXPLORER_STRATEGIES` against N.

    Args:
        model: A preset name, a ``config.json`` path or dict, or a ModelSpec (``spec_from_mlx``,
            ``spec_from_nnx``; no activations). num_shards: ``(low, high)``, powers of two in 1..1024: every power between.
        param_dtype, master_dtype, optimizer, update_copies: As :func:`estimate_memory`.
        micro_batch_size: Sequences per rank. seq_len: Tokens per sequence.

    Raises:
        ValueError: naming the bad knob.
    """
    return MemoryExplorer(model, num_shards, param_dtype=param_dtype, master_dtype=master_dtype, optimizer=optimizer,
                          micro_batch_size=micro_batch_size, seq_len=seq_len, update_copies=update_copies)

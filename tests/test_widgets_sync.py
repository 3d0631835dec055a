"""Explorer figures send only what changed (issue 18: the layout explorer took 363-1146 ms per control).

A control change used to delete every trace, add them again and relayout, in each of three figures:
nine redraws in the browser. Now an unchanged figure sends nothing, a figure whose traces keep their
types sends its changed properties in one ``Plotly.update``, and plans and figures are memoised. These
tests check that what the widgets hold is still exactly what the figure functions draw; the round
trip in a real browser is timed by ``tests/test_browser.py`` (``build/ux/round-trip-ms.json``).
"""

import numpy as np
import plotly.graph_objects as go
import pytest
from test_widgets import figure_json, medium_spec

from workbench import MiB
from workbench.views.plans import fig_bucket_layout
from workbench.views.shard_map import fig_rank_load, fig_shard_map
from workbench.core.param_kinds import PARAM_KINDS
from workbench.views.style import TEMPLATE
from workbench.views.widget_sync import sync_figure_widget
from workbench.views.widgets import build_layout_explorer

SENDS = ("_send_addTraces_msg", "_send_deleteTraces_msg", "_send_update_msg", "_send_relayout_msg",
         "_send_restyle_msg")


def spy_messages(fw: go.FigureWidget) -> list[str]:
    """The kinds of message ``fw`` sends to the browser from now on, in order."""
    sent = []
    for name in SENDS:
        original = getattr(fw, name)

        def spy(*args, _name=name, _original=original, **kwargs):
            sent.append(_name.removeprefix("_send_").removesuffix("_msg"))
            return _original(*args, **kwargs)

        setattr(fw, name, spy)
    return sent


def pruned(value):
    """JSON without empty containers and None (what a cleared property leaves behind)."""
    if isinstance(value, dict):
        value = {key: pruned(v) for key, v in value.items()}
        return {key: v for key, v in value.items() if v not in (None, {}, [])}
    if isinstance(value, list):
        return [pruned(v) for v in value]
    return value


def shows(fw: go.FigureWidget, fig: go.Figure) -> None:
    """``fw`` draws ``fig``: the same traces, and the same layout but for the template (set once, when the
    widget is made) and the explorer's width."""
    shown, want = (pruned(figure_json(f)) for f in (fw, fig))
    assert shown["data"] == want["data"]
    for layout in (shown["layout"], want["layout"]):
        layout.pop("template", None)
        layout.pop("width", None)
    assert shown["layout"] == want["layout"]


def bars(y, name="a", **layout):
    return go.Figure([go.Bar(x=np.arange(len(y)), y=np.asarray(y, dtype=float), name=name)],
                     layout=dict(template=TEMPLATE, **layout))


def test_same_traces_go_in_one_update_and_a_dropped_property_is_cleared():
    fw = go.FigureWidget(layout=dict(template=TEMPLATE))
    first = bars([1, 2], title_text="one", yaxis_range=[0, 5])
    first.data[0].marker.color = "red"
    shown = sync_figure_widget(fw, first, None)
    shows(fw, first)
    sent = spy_messages(fw)
    second = bars([3, 4, 5], name="b", title_text="two")  # no marker colour, no y range
    shown = sync_figure_widget(fw, second, shown)
    assert sent == ["update"]  # one Plotly.update: one redraw
    shows(fw, second)
    assert fw.data[0].marker.color is None and fw.layout.yaxis.range is None
    assert list(fw.data[0].y) == [3.0, 4.0, 5.0]  # numbers, not plotly's base64 dicts
    assert not any(isinstance(v, np.ndarray) for v in fw.data[0]._props.values())  # lists: see style._arrays
    sync_figure_widget(fw, bars([3, 4, 5], name="b", title_text="two"), shown)
    assert sent == ["update"]  # an unchanged figure sends nothing


def test_other_traces_are_replaced_and_drawn_once():
    fw = go.FigureWidget(layout=dict(template=TEMPLATE))
    shown = sync_figure_widget(fw, bars([1, 2], title_text="bars"), None)
    sent = spy_messages(fw)
    lines = go.Figure([go.Scatter(x=[0, 1], y=[2, 3]), go.Scatter(x=[0, 1], y=[1, 1])],
                      layout=dict(template=TEMPLATE, title_text="lines"))
    sync_figure_widget(fw, lines, shown)
    # The layout goes to the emptied plot; adding the traces is the one redraw that draws them.
    assert sent == ["deleteTraces", "update", "addTraces"]  # the layout as a Plotly.update of no trace
    shows(fw, lines)


def expected_figures(explorer) -> dict[str, go.Figure]:
    plans = explorer.shard_plans
    v = {name: c.value for name, c in explorer.controls.items()}
    compared = dict(list(plans.items())[:2])
    return {"bucket_layout": fig_bucket_layout(explorer.bucket_plan),
            "shard_map": fig_shard_map(compared, v["bucket"], rank=v["rank"]),
            "rank_load": fig_rank_load(plans)}


@pytest.mark.parametrize("model", [medium_spec(), "llama-3-8b"], ids=["medium", "llama-3-8b"])
def test_every_control_leaves_each_figure_widget_showing_its_figure_function(model):
    explorer = build_layout_explorer(model, communication_size=MiB, num_shards=4)
    c = explorer.controls
    changes = [("communication_size", 2 * MiB), ("num_shards", 8), ("layout", "flat"), ("policy", "pytorch-ddp"),
               ("layout", "row"), ("pad_rows", True), ("bucket", 2), ("rank", 5), ("num_shards", 2),
               ("layout", "greedy"), ("communication_size", 0), ("communication_size", MiB), ("num_shards", 4)]
    if isinstance(model, str):
        changes.append(("model", "mixtral-8x7b"))  # other trace kinds: the figure is replaced
    for name, value in changes:
        c[name].value = value
        assert "Error" not in explorer.status.value, (name, value, explorer.status.value)
        for figure, fig in expected_figures(explorer).items():
            shows(explorer.figures[figure], fig)


def test_a_bucket_change_redraws_only_the_shard_map_and_plans_are_reused():
    explorer = build_layout_explorer("llama-3-8b", communication_size=32 * MiB, num_shards=8)
    sent = {name: spy_messages(fw) for name, fw in explorer.figures.items()}
    explorer.controls["bucket"].value = 3
    assert sent == {"bucket_layout": [], "shard_map": ["update"], "rank_load": []}
    explorer.controls["rank"].value = 5  # all 8 ranks are drawn: the inspector changes, no figure
    assert sent == {"bucket_layout": [], "shard_map": ["update"], "rank_load": []}
    plan = explorer.shard_plans["row"]
    explorer.controls["num_shards"].value = 16
    explorer.controls["num_shards"].value = 8  # back: the memoised plans, not new ones
    assert explorer.shard_plans["row"] is plan
    explorer.controls["link"].value = list(explorer.controls["link"].options)[1]  # the cost line only
    assert sent["bucket_layout"] == [] and sent["rank_load"] == ["update", "update"]


def test_another_model_is_one_update_once_the_widget_has_a_slot_for_each_trace():
    """Mixtral has one more parameter kind (one more bar trace) than Llama: the bucket layout reserved a bar
    slot per kind on its first draw, so every switch, either way, is one ``Plotly.update``, each kind the model
    lacks a hidden trace."""
    explorer = build_layout_explorer("llama-3-8b", communication_size=32 * MiB, num_shards=8)
    sent = spy_messages(explorer.figures["bucket_layout"])
    for model in ("mixtral-8x7b", "llama-3-8b", "mixtral-8x7b", "llama-3-8b"):
        explorer.controls["model"].value = model
        for figure, fig in expected_figures(explorer).items():
            shows(explorer.figures[figure], fig)
    assert sent == ["update"] * 4, sent
    data = explorer.figures["bucket_layout"].data
    assert [t.type for t in data] == ["bar"] * len(PARAM_KINDS) + ["scatter"] * 2
    hidden = [t for t in data if t.visible is False]
    assert len(hidden) == len(PARAM_KINDS) + 2 - 5 and all(t.x is None for t in hidden)  # Llama: 4 kinds, the cap


def test_a_figure_with_more_traces_of_a_kind_than_its_slots_grows_the_widget_once():
    fw = go.FigureWidget(layout=dict(template=TEMPLATE))
    two = go.Figure([go.Bar(x=[0], y=[1]), go.Bar(x=[1], y=[2]), go.Scatter(x=[0, 1], y=[1, 1])])
    one = go.Figure([go.Bar(x=[0], y=[3]), go.Scatter(x=[0, 1], y=[2, 2])])
    shown = sync_figure_widget(fw, one, None, slots=(("bar", 1), ("scatter", 1)))
    sent = spy_messages(fw)
    shown = sync_figure_widget(fw, two, shown)  # two bars: more than the one slot, a replacement
    shown = sync_figure_widget(fw, one, shown)  # back to one bar: the second is hidden, an update
    assert sent == ["deleteTraces", "addTraces", "update"], sent  # (the same layout: no relayout)
    shows(fw, one)
    assert [t.type for t in fw.data] == ["bar", "bar", "scatter"] and fw.data[1].visible is False


def test_figure_widgets_share_one_copy_of_plotly_widget_code_per_kernel():
    """A CI run's explorer figures stayed blank: each FigureWidget sent plotly's 5 MB widget code, the page imported
    it once per figure, and under load a figure missed anywidget's 2 s start. The workbench's FigureWidget sends a
    small module that imports the code once per page from one PlotlyCode widget per kernel (made again once closed);
    in the kernel it is plotly's FigureWidget (the browser tests draw it)."""
    import plotly

    from workbench.views.figure_widget import FORGET_S, FigureWidget, plotly_code

    code = str(go.FigureWidget._esm)
    assert len(code) > 1_000_000 and plotly_code().code == code
    first, second = FigureWidget(go.Bar(x=[1], y=[2])), FigureWidget()
    states = [first.get_state(), second.get_state()]
    assert {s["_plotly_code"] for s in states} == {f"IPY_MODEL_{plotly_code().model_id}"}
    assert all(len(s["_esm"]) < 5_000 for s in states) and f"__workbenchPlotlyWidget_{plotly.__version__}" in states[0]["_esm"]
    assert f"setTimeout(forget, {FORGET_S * 1000})" in states[0]["_esm"]  # a hung import is forgotten, tried again
    assert isinstance(first, go.FigureWidget) and first.to_dict()["data"][0]["type"] == "bar"
    first.add_scatter(y=[3, 4])  # plotly's own edits, unchanged
    assert [t.type for t in first.data] == ["bar", "scatter"] and first._last_trace_edit_id == 1
    closed = plotly_code()
    for widget in (first, second, closed):  # as ipywidgets.Widget.close_all() does: the next figure sends the code again
        widget.close()
    assert FigureWidget().get_state()["_plotly_code"] == f"IPY_MODEL_{plotly_code().model_id}" and plotly_code() is not closed

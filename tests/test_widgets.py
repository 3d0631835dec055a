"""The layout explorer wires controls to the planners and figure functions, and survives invalid settings."""

import base64
import json

import numpy as np
import pytest

from workbench import MiB, ModelSpec, plan_buckets
from workbench.core.presets import get_preset
from workbench.core.units import format_seconds
from workbench.views.plans import fig_bucket_layout
from workbench.views.shard_map import fig_rank_load, fig_shard_map
from workbench.views.widgets import FIGURES, build_layout_explorer


def medium_spec(extra: dict | None = None) -> ModelSpec:
    """A float32 Llama-shaped model of ~7.5 MiB: 1 MiB embedding, head and MLPs, 256 KiB q."""
    shapes = {"model.embed_tokens.weight": (1024, 256)}
    for i in range(4):
        p = f"model.layers.{i}."
        shapes |= {p + "self_attn.q_proj.weight": (256, 256), p + "self_attn.k_proj.weight": (128, 256),
                   p + "mlp.up_proj.weight": (1024, 256), p + "input_layernorm.weight": (256,)}
    shapes |= extra or {}
    shapes |= {"model.norm.weight": (256,), "lm_head.weight": (1024, 256)}
    return ModelSpec.from_shapes(shapes, name="medium")


def llama70b_like() -> ModelSpec:
    """Llama-3-70B's 723 arrays (shapes of the HF checkpoint), bf16."""
    return get_preset("llama-3-70b")


def buckets_shown(explorer) -> int:
    return len({int(x) for t in explorer.figures["bucket_layout"].data if t.type == "bar" and t.visible is not False
                for x in t.x})


def snapshot(explorer) -> dict:
    return {name: fw.to_json() for name, fw in explorer.figures.items()}


def decoded(value):
    """JSON with plotly's base64 arrays ({"dtype", "bdata"}) turned back into lists."""
    if isinstance(value, dict) and "bdata" in value:
        array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        return array.reshape([int(d) for d in str(value["shape"]).split(",")]).tolist() if "shape" in value else array.tolist()
    if isinstance(value, dict):
        return {key: decoded(v) for key, v in value.items()}
    if isinstance(value, list):
        return [decoded(v) for v in value]
    return value


def figure_json(fig) -> dict:
    """What ``fig`` draws: its JSON, arrays as lists, without trace uids and hidden traces (the slots a figure
    widget keeps for other models' traces, :func:`workbench.views.style.sync_figure_widget`)."""
    out = decoded(json.loads(fig.to_json()))
    out["data"] = [trace for trace in out["data"] if trace.get("visible") is not False]
    for trace in out["data"]:
        trace.pop("uid", None)
    return out


def test_explorer_exposes_controls_figures_status():
    explorer = build_layout_explorer()  # tiny-llama preset, 32 MiB, N=8, row, mlx
    assert set(explorer.controls) == {"model", "policy", "communication_size", "num_shards", "layout", "pad_rows", "bucket",
                                      "rank", "link"}
    assert set(explorer.figures) == set(FIGURES)
    assert "Error" not in explorer.status.value and "tiny-llama" in explorer.status.value
    assert explorer.controls["communication_size"].value == 32 * MiB and explorer.controls["num_shards"].value == 8
    assert list(explorer.shard_plans) == ["row", "flat", "greedy"]
    assert buckets_shown(explorer) == explorer.bucket_plan.num_buckets
    assert explorer.update() is True


def test_figure_widgets_hold_the_figure_functions_output():
    explorer = build_layout_explorer(medium_spec(), communication_size=2 * MiB, num_shards=4)
    explorer.controls["bucket"].value = 2
    plans = explorer.shard_plans
    expected = {
        "bucket_layout": fig_bucket_layout(explorer.bucket_plan),
        "shard_map": fig_shard_map({"row": plans["row"], "flat": plans["flat"]}, 2),
        "rank_load": fig_rank_load(plans),
    }
    for name, fig in expected.items():
        shown, want = figure_json(explorer.figures[name]), figure_json(fig)
        assert shown["data"] == want["data"], name
        assert shown["layout"]["title"] == want["layout"]["title"], name


def test_communication_size_changes_the_buckets_shown():
    spec = medium_spec()
    explorer = build_layout_explorer(spec, communication_size=32 * MiB, num_shards=4)
    assert buckets_shown(explorer) == 1
    explorer.controls["communication_size"].value = MiB
    num = plan_buckets(spec, MiB).num_buckets
    assert num > 1 and buckets_shown(explorer) == num
    assert f"{num} buckets" in explorer.figures["bucket_layout"].layout.title.text
    cap = lambda: [t for t in explorer.figures["bucket_layout"].data if t.legendgroup == "communication_size"]  # noqa: E731
    assert cap()[0].y == (1.0, 1.0)
    explorer.controls["communication_size"].value = 0
    assert buckets_shown(explorer) == len(spec)
    assert not cap()  # no threshold line at 0
    explorer.controls["policy"].value = "pytorch-ddp"
    explorer.controls["communication_size"].value = MiB
    assert buckets_shown(explorer) == plan_buckets(spec, MiB, policy="pytorch-ddp").num_buckets
    assert "pytorch-ddp" in explorer.figures["bucket_layout"].layout.title.text


def test_num_shards_changes_the_shard_figures():
    explorer = build_layout_explorer(medium_spec(), communication_size=MiB, num_shards=4)
    assert list(explorer.figures["shard_map"].layout.yaxis.ticktext) == ["0", "1", "2", "3"]
    explorer.controls["num_shards"].value = 64
    assert explorer.shard_plans["row"].num_shards == 64
    ticks = list(explorer.figures["shard_map"].layout.yaxis.ticktext)
    assert len(ticks) == 16 and ticks[-1] == "63"
    assert "of 64 shown" in explorer.figures["shard_map"].layout.title.text
    owned = next(t for t in explorer.figures["rank_load"].data if t.name == "row owned")
    np.testing.assert_allclose(owned.y, explorer.shard_plans["row"].rank_owned_bytes / MiB)
    explorer.controls["layout"].value = "greedy"
    assert list(explorer.shard_plans)[:2] == ["greedy", "flat"]
    assert explorer.figures["shard_map"].layout.annotations[0].text.startswith("greedy")


def test_bucket_slider_follows_the_plan():
    explorer = build_layout_explorer(medium_spec(), communication_size=MiB, num_shards=2)
    num = explorer.bucket_plan.num_buckets
    assert explorer.controls["bucket"].max == num - 1
    explorer.controls["bucket"].value = 3
    assert explorer.figures["shard_map"].layout.title.text.startswith(f"Bucket 3 of {num}")
    explorer.controls["communication_size"].value = 32 * MiB  # one bucket: the slider clamps to 0
    assert explorer.controls["bucket"].value == 0 and explorer.controls["bucket"].max == 0
    assert explorer.figures["shard_map"].layout.title.text.startswith("Bucket 0 of 1")


def subplot_titles(fw) -> list[str]:
    return [a.text.split(":")[0] for a in fw.layout.annotations]


def test_indivisible_row_layout_shows_the_error_and_keeps_the_figures():
    spec = medium_spec({"model.extra.weight": (3, 5)})
    explorer = build_layout_explorer(spec, communication_size=MiB, num_shards=2, layout="flat")
    assert "Error" not in explorer.status.value and "row not shown" in explorer.status.value
    assert subplot_titles(explorer.figures["shard_map"]) == ["flat", "greedy"]  # row cannot plan: greedy instead
    assert len(subplot_titles(explorer.figures["rank_load"])) == 2
    before = snapshot(explorer)

    explorer.controls["layout"].value = "row"
    assert "Error" in explorer.status.value
    assert "Cannot shard parameter &#x27;model.extra.weight&#x27; with shape (3, 5)" in explorer.status.value
    assert snapshot(explorer) == before
    assert explorer.update() is False and snapshot(explorer) == before

    explorer.controls["pad_rows"].value = True  # FSDP2-style padding makes row valid
    assert "Error" not in explorer.status.value and explorer.shard_plans["row"].pad_rows
    assert subplot_titles(explorer.figures["shard_map"]) == ["row", "flat"]
    assert len(subplot_titles(explorer.figures["rank_load"])) == 3
    assert snapshot(explorer) != before

    explorer.controls["layout"].value = "flat"
    explorer.controls["pad_rows"].value = False  # two rank-load rows again: the third row's axes are cleared
    assert len(subplot_titles(explorer.figures["rank_load"])) == 2
    assert not explorer.figures["rank_load"].layout.yaxis3.to_plotly_json()
    shown, want = (figure_json(f)["layout"] for f in (explorer.figures["rank_load"], fig_rank_load(explorer.shard_plans)))
    assert {key: value for key, value in shown.items() if key in want} == want
    assert all(not value for key, value in shown.items() if key not in want and key != "width")  # width: the explorer's


def test_model_dropdown_lists_the_given_spec_and_presets():
    explorer = build_layout_explorer(medium_spec(), communication_size=MiB, num_shards=2)
    options = explorer.controls["model"].options
    assert options[0][0] == "medium (given)" and "tiny-llama" in [label for label, _ in options]
    explorer.controls["model"].value = "tiny-llama"
    assert explorer.bucket_plan.spec.name == "tiny-llama" and "tiny-llama" in explorer.status.value


def test_values_off_the_slider_scales_are_added():
    explorer = build_layout_explorer(medium_spec(), communication_size=3 * MiB, num_shards=6, layout="flat")
    assert explorer.controls["communication_size"].value == 3 * MiB
    assert explorer.controls["num_shards"].value == 6 and explorer.shard_plans["flat"].num_shards == 6


@pytest.mark.parametrize("kwargs, match", [
    (dict(layout="diagonal"), "Unknown layout"), (dict(policy="zero3"), "Unknown bucket policy"),
    (dict(num_shards=0), "num_shards"), (dict(communication_size=-1), "communication_size"),
    (dict(spec_or_preset="no-such-model"), "spec_or_preset: .no-such-model. is neither a preset"),
])
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_layout_explorer(**kwargs)


def test_update_at_1024_ranks_on_a_70b_like_model_aggregates_ranks():
    explorer = build_layout_explorer(llama70b_like(), communication_size=32 * MiB, num_shards=1024)
    assert "Error" not in explorer.status.value
    assert explorer.update()
    assert "1024" in explorer.figures["shard_map"].layout.title.text


def test_rank_picker_draws_and_inspects_any_rank():
    """Issue 18: at N = 1024 no rank but 0-7 and 1016-1023 could be inspected."""
    from workbench.views.rank_inspector import rank_inspector_html

    explorer = build_layout_explorer("qwen3-4b", communication_size=64 * MiB, num_shards=1024, pad_rows=True)
    rank = explorer.controls["rank"]
    assert rank.max == 1023 and type(rank).__name__ == "BoundedIntText"
    rank.value = 517
    assert "<b>517</b>" in explorer.figures["shard_map"].layout.yaxis.ticktext
    assert explorer.inspector.value == rank_inspector_html(explorer.shard_plans["row"], 517)
    explorer.controls["num_shards"].value = 8  # the rank clamps to the new N
    assert rank.value == 7 and rank.max == 7 and "rank 7 of 8" in explorer.inspector.value


def test_bucket_control_is_a_typed_field_and_the_toggle_fits_one_line():
    """Issue 18: a 77 px slider track for up to 802 buckets; the layout toggle wrapped "greedy" alone."""
    from workbench.views.widgets import FIGURE_WIDTH

    explorer = build_layout_explorer("mixtral-8x7b", communication_size=32 * MiB)
    bucket = explorer.controls["bucket"]
    assert type(bucket).__name__ == "BoundedIntText" and bucket.max == explorer.bucket_plan.num_buckets - 1 > 800
    bucket.value = 801
    assert explorer.figures["shard_map"].layout.title.text.startswith("Bucket 801 of")
    toggle = explorer.controls["layout"]
    assert toggle.style.button_width == "72px" and 3 * 72 + 60 < 440  # three buttons and the label in one row
    assert all(fw.layout.width == FIGURE_WIDTH for fw in explorer.figures.values())


def test_code_line_reproduces_the_view():
    """'Copy these settings as code': the call shown rebuilds the same figures."""
    explorer = build_layout_explorer("llama-3-8b", communication_size=16 * MiB, num_shards=64)
    explorer.controls["layout"].value = "flat"
    explorer.controls["bucket"].value = 5
    explorer.controls["rank"].value = 40
    line = explorer.code_line()
    assert line == ("build_layout_explorer('llama-3-8b', communication_size=16 * MiB, num_shards=64, layout='flat', "
                    "policy='mlx', pad_rows=False, bucket=5, rank=40)")
    assert line in explorer.code.value.replace("&#x27;", "'")
    again = eval(line, {"build_layout_explorer": build_layout_explorer, "MiB": MiB})
    assert snapshot(again) == snapshot(explorer)
    spec = medium_spec()
    given = build_layout_explorer(spec, communication_size=MiB, num_shards=4)  # a user's ModelSpec
    assert given.code_line().startswith("build_layout_explorer(spec, communication_size=1 * MiB")
    assert snapshot(eval(given.code_line(), {"build_layout_explorer": build_layout_explorer, "MiB": MiB,
                                             "spec": spec})) == snapshot(given)


def test_cost_line_is_the_communication_model():
    """Cost beside layout: predicted collectives and time from estimate_comm on the chosen link."""
    from workbench.estimate.comm import estimate_comm
    from workbench.views.widgets import LINKS

    explorer = build_layout_explorer("llama-3-8b", communication_size=32 * MiB, num_shards=8)
    for link in LINKS:
        explorer.controls["link"].value = link
        comm = estimate_comm(explorer.shard_plans["row"], "fsdp")
        assert f"{comm.num_collectives} collectives per step" in explorer.cost.value
        assert f"about {format_seconds(comm.predict_s(LINKS[link]))} of communication" in explorer.cost.value
    explorer.controls["layout"].value = "greedy"
    comm = estimate_comm(explorer.shard_plans["greedy"], "zero1")
    assert explorer.cost.value.startswith("cost (zero1, ") and f"{comm.num_collectives} collectives" in explorer.cost.value


def test_metrics_table_is_html_with_every_row_and_no_empty_cell():
    """Issue 18: the explorer's plotly table drew cells with a space blank and cut its header; the browser
    now lays out an HTML table of the same cells (test_browser checks it drawn)."""
    from workbench.views.tables import layout_metrics_html, layout_metrics_rows

    explorer = build_layout_explorer("llama-3-8b", communication_size=32 * MiB, num_shards=8)
    header, rows = layout_metrics_rows(explorer.shard_plans)
    assert [r[0] for r in rows] == ["row", "flat", "greedy"] and all(all(c for c in r) for r in rows)
    assert explorer.metrics.value == layout_metrics_html(explorer.shard_plans)
    assert explorer.metrics.value.count("<tr>") == 4 and "white-space:nowrap" in explorer.metrics.value
    assert explorer.metrics in explorer.children


def test_the_layout_explorer_takes_a_config_where_a_preset_goes():
    """Issue 15: a config.json path or its dict wherever a preset name goes."""
    from pathlib import Path

    from workbench.core.hf_config import spec_from_hf_config
    from workbench.views.widgets import build_layout_explorer

    config = Path(__file__).parent / "data" / "hf_configs" / "qwen3_0_6b.json"
    explorer = build_layout_explorer(str(config), num_shards=8)
    given = explorer.controls["model"].value
    assert given == spec_from_hf_config(config) and explorer.controls["model"].label.endswith("(given)")
    with pytest.raises(ValueError, match="spec_or_preset"):
        build_layout_explorer("no-such-model")

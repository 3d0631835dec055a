"""The explorers as a reader meets them (issue 29, items 2-5), in one process: the live FigureWidgets'
layout and data after each control change, the widths of figures and controls, the busy cue around a
redraw, and the memory explorer's labels, capacity line and largest micro-batch that fits."""

import pytest

from workbench.core.presets import get_preset

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def shard_map_axes(explorer) -> list:
    fw = explorer.figures["shard_map"]
    return [fw.layout[name] for name in ("yaxis", "yaxis2") if name in fw.layout]


def assert_rank_0_on_top(explorer, step: str) -> None:
    """Each shard-map subplot draws its first shown rank at the top by an explicit reversed range that covers
    every rank drawn: plotly.js keeps autorange="reversed" only in a range it computes, and a live widget's
    later update lost it (rank 1023 on top after a model change)."""
    axes = shard_map_axes(explorer)
    assert len(axes) == 2, step
    for axis in axes:
        ticks = list(axis.tickvals)
        ranks = [int(str(t).replace("<b>", "").replace("</b>", "")) for t in axis.ticktext]
        assert ranks == sorted(ranks) and ticks == list(range(len(ranks))), step
        assert axis.autorange is False and axis.range is not None, (step, axis.autorange, axis.range)
        top, bottom = axis.range
        assert top > bottom and bottom < ticks[0] and top > ticks[-1], (step, axis.range)
        assert top - bottom == pytest.approx(len(ticks)), (step, axis.range)  # the whole rank list, no more


def test_shard_map_keeps_rank_0_at_the_top_after_every_control():
    from workbench.core.units import MiB
    from workbench.views.widgets import build_layout_explorer

    explorer = build_layout_explorer("llama-3-8b", communication_size=32 * MiB, num_shards=8)
    assert_rank_0_on_top(explorer, "first draw")
    c = explorer.controls
    steps = [("communication_size", 16 * MiB), ("num_shards", 1024), ("layout", "greedy"), ("policy", "pytorch-ddp"),
             ("pad_rows", True), ("bucket", 150), ("rank", 517), ("model", "mixtral-8x7b"), ("layout", "flat"),
             ("num_shards", 16), ("model", "tiny-llama"), ("link", list(c["link"].options)[-1])]
    for name, value in steps:
        c[name].value = value
        assert explorer.status.value.startswith(("llama", "mixtral", "tiny")), (name, explorer.status.value)
        assert_rank_0_on_top(explorer, f"{name}={value}")

"""Figures show exactly what the planners computed, stay small on Llama-3-70B at N=1024, and are deterministic."""

import json
from collections import defaultdict

import numpy as np
import plotly.graph_objects as go
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench import MiB, ModelSpec, ParamSpec, format_bytes, plan_buckets, plan_shards
from workbench.core.presets import get_preset
from workbench.views import plans as figures
from workbench.views import shard_map, style
from workbench.views.plans import fig_bucket_layout, fig_buckets_vs_size, fig_layout_metrics, fig_padding_vs_shards
from workbench.views.shard_map import fig_rank_load, fig_shard_map
from workbench.core.param_kinds import param_kind


def llama70b_like() -> ModelSpec:
    """Llama-3-70B's 723 arrays (shapes of the HF checkpoint), bf16."""
    return get_preset("llama-3-70b")


def small_spec(num_layers: int = 3) -> ModelSpec:
    """A Llama-shaped float32 model of a few KiB: embed (64, 16) is 4 KiB, q is 1 KiB."""
    shapes = {"model.embed_tokens.weight": (64, 16)}
    for i in range(num_layers):
        p = f"model.layers.{i}."
        shapes |= {p + "self_attn.q_proj.weight": (16, 16), p + "self_attn.k_proj.weight": (8, 16),
                   p + "mlp.up_proj.weight": (32, 16), p + "input_layernorm.weight": (16,)}
    shapes |= {"model.norm.weight": (16,), "lm_head.weight": (64, 16)}
    return ModelSpec.from_shapes(shapes, name="small")


@pytest.fixture(scope="module")
def big():
    spec = llama70b_like()
    bp = plan_buckets(spec, 32 * MiB)
    return spec, bp, {layout: plan_shards(bp, 1024, layout) for layout in ("row", "flat", "greedy")}


def bars(fig, name_prefix=None):
    return [t for t in fig.data if t.type == "bar" and (name_prefix is None or t.name.startswith(name_prefix))]


def shard_segments(fig, subplot: int):
    """{rank: [(path, start, stop, local_start, local_stop)]} and {rank: [(local_start, local_stop)]} of one subplot."""
    yref = "y" if subplot == 0 else f"y{subplot + 1}"
    real, pad = defaultdict(list), defaultdict(list)
    for t in fig.data:
        if (t.yaxis or "y") != yref:
            continue
        for row in t.customdata:
            if t.name == "padding":
                pad[int(row[2])].append((int(row[0]), int(row[1])))
            else:
                real[int(row[5])].append((row[0], int(row[1]), int(row[2]), int(row[3]), int(row[4])))
    return real, pad


# --------------------------------------------------------------------------- kinds


@pytest.mark.parametrize("path, kind", [
    ("model.embed_tokens.weight", "embedding"), ("lm_head.weight", "embedding"), ("transformer.wte.weight", "embedding"),
    ("model.layers.3.self_attn.q_proj.weight", "attention"), ("transformer.h.0.attn.c_attn.bias", "attention"),
    ("model.layers.3.self_attn.q_norm.weight", "norm"), ("transformer.h.0.ln_1.weight", "norm"),
    ("model.layers.0.mlp.down_proj.weight", "mlp"), ("transformer.h.0.mlp.c_proj.weight", "mlp"),
    ("model.layers.0.block_sparse_moe.experts.3.w1.weight", "expert"), ("model.layers.0.mlp.experts.7.up_proj.weight", "expert"),
    ("model.layers.0.block_sparse_moe.gate.weight", "mlp"), ("scale", "other"),
])
def test_param_kind(path, kind):
    assert param_kind(path) == kind


# --------------------------------------------------------------------------- bucket layout


@pytest.mark.parametrize("cap, policy", [(6 * 1024, "mlx"), (5000, "pytorch-ddp"), (0, "mlx"), (10**9, "mlx")])
def test_bucket_layout_bars_sum_to_bucket_bytes(cap, policy):
    bp = plan_buckets(small_spec(), cap, policy=policy)
    fig = fig_bucket_layout(bp)
    totals = np.zeros(bp.num_buckets)
    segments = defaultdict(list)
    for t in bars(fig):
        np.add.at(totals, np.asarray(t.x, int), np.asarray(t.y))
        for x, base, y in zip(t.x, t.base, t.y):
            segments[int(x)].append((base, base + y))
    np.testing.assert_allclose(totals, bp.bucket_bytes / MiB)
    for b, segs in segments.items():  # segments of a bucket tile [0, its size)
        segs.sort()
        assert segs[0][0] == 0 and np.allclose([s[1] for s in segs[:-1]], [s[0] for s in segs[1:]])
    paths = [row[0] for t in bars(fig) for row in t.customdata]
    assert sorted(paths) == sorted(bp.spec.paths)
    assert f"{bp.num_buckets} buckets" in fig.layout.title.text and bp.policy.name in fig.layout.title.text


def test_bucket_layout_threshold_and_tail():
    bp = plan_buckets(small_spec(), 6 * 1024)
    assert bp.bucket_bytes[-1] < bp.communication_size  # the case under test
    fig = fig_bucket_layout(bp)
    (line,) = [t for t in fig.data if t.legendgroup == "communication_size"]
    assert list(line.y) == [bp.communication_size / MiB] * 2 and line.name == "communication_size = 6.00 KiB"
    assert list(line.x) == [-0.5, bp.num_buckets - 0.5] and line.showlegend is not False
    (tail,) = [t for t in fig.data if t.name.startswith("tail")]
    assert list(tail.x) == [bp.num_buckets - 1] and tail.y[0] > bp.bucket_bytes[-1] / MiB
    assert "tail (last bucket) " + format_bytes(bp.bucket_bytes[-1]) in fig.layout.title.text
    assert not fig.layout.annotations and not fig.layout.shapes  # no label sits on the bars

    no_cap = fig_bucket_layout(plan_buckets(small_spec(), 0))
    assert all(t.type == "bar" for t in no_cap.data)
    one_bucket = fig_bucket_layout(plan_buckets(small_spec(), 64))  # every bucket reaches the cap
    assert not [t for t in one_bucket.data if t.name.startswith("tail")]


@pytest.mark.parametrize("preset", ["llama-3-8b", "mixtral-8x7b"])
def test_bucket_layout_gives_every_bucket_exactly_its_own_slot(preset):
    """Issue 18: Llama-3-8B's embedding buckets (0 and 161) were drawn ~137 slots wide, hiding 0-68 and 92-161.

    Each bar now spans [i - 0.4, i + 0.4] of its own index i, whatever its size; only the height is bytes.
    """
    bp = plan_buckets(get_preset(preset), 32 * MiB)
    fig = fig_bucket_layout(bp)
    drawn = set()
    for t in bars(fig):
        assert t.width == figures.BUCKET_BAR_WIDTH == 0.8 and t.offset is None, t.name  # a scalar: no trace infers it
        x = np.asarray(t.x)
        assert np.array_equal(x, x.astype(int))
        drawn |= set(x.astype(int).tolist())
    assert fig.layout.barmode == "overlay" and fig.layout.xaxis.range == (-0.5, bp.num_buckets - 0.5)
    assert drawn == set(range(bp.num_buckets))
    assert "one bar per bucket" in fig.layout.xaxis.title.text and "width carries no size" in fig.layout.xaxis.title.text
    assert fig.layout.yaxis.title.text == "bytes in the bucket (MiB)"


def test_bucket_layout_colours_by_kind():
    fig = fig_bucket_layout(plan_buckets(small_spec(), 0))
    by_name = {t.name: t for t in bars(fig)}
    assert set(by_name) == {"embedding", "attention", "mlp", "norm"}
    assert all(param_kind(row[0]) == name for name, t in by_name.items() for row in t.customdata)
    assert by_name["mlp"].marker.color == style.KIND_COLORS["mlp"]


@pytest.mark.parametrize("limit, level", [(11, "kind run"), (3, "bucket")])
def test_bucket_layout_merges_segments_past_the_limit(monkeypatch, limit, level):
    monkeypatch.setattr(figures, "MAX_BUCKET_SEGMENTS", limit)
    bp = plan_buckets(small_spec(), 10**9 if level == "kind run" else 12 * 1024)
    fig = fig_bucket_layout(bp)
    totals = np.zeros(bp.num_buckets)
    for t in bars(fig):
        np.add.at(totals, np.asarray(t.x, int), np.asarray(t.y))
    np.testing.assert_allclose(totals, bp.bucket_bytes / MiB)
    assert f"merged {level}s" in fig.layout.title.text
    assert sum(len(t.x) for t in bars(fig)) <= max(limit, bp.num_buckets)


# --------------------------------------------------------------------------- shard map


@pytest.mark.parametrize("layout, pad_rows, n", [("row", False, 4), ("row", True, 3), ("flat", False, 3), ("greedy", False, 5)])
def test_shard_map_segments_are_the_rank_slices(layout, pad_rows, n):
    bp = plan_buckets(small_spec(), 6 * 1024)
    plan = plan_shards(bp, n, layout, pad_rows=pad_rows)
    for b in range(bp.num_buckets):
        fig = fig_shard_map({layout: plan}, bucket=b)
        real, pad = shard_segments(fig, 0)
        for r in range(n):
            expected = [(s.path, s.start, s.stop) for s in plan.rank_slices(r) if s.bucket == b]
            assert [seg[:3] for seg in real[r]] == expected
            pieces = sorted([seg[3:] for seg in real[r]] + pad[r])  # local offsets tile the rank's buffer
            assert all(a[1] == b_[0] for a, b_ in zip(pieces, pieces[1:]))
            size = sum(hi - lo for lo, hi in pieces)
            if layout == "greedy":
                assert not pad[r] and size == sum(s[2] - s[1] for s in expected)
            else:
                assert pieces[0][0] == 0 and size == plan.bucket_chunk_elems[b]


def test_shard_map_side_by_side_and_padding_grey():
    spec = ModelSpec.from_shapes({"a": (3, 5), "b": (4, 4)}, name="odd")
    bp = plan_buckets(spec, 10**6)
    plans = {"row": plan_shards(bp, 4, "row", pad_rows=True), "flat": plan_shards(bp, 4, "flat")}
    fig = fig_shard_map(plans)
    assert {t.xaxis for t in fig.data} == {"x", "x2"}
    assert [a.text.split(":")[0] for a in fig.layout.annotations] == ["row", "flat"]
    padding = [t for t in fig.data if t.name == "padding"]
    assert padding and all(t.marker.color == style.PADDING_COLOR for t in padding)
    assert sum(1 for t in padding if t.showlegend) == 1
    # flat: 31 elements in 4 chunks of 8, the last rank pads 1
    _, pad = shard_segments(fig, 1)
    assert dict(pad) == {3: [(7, 8)]}


def test_shard_map_rejects_bad_bucket():
    plan = plan_shards(plan_buckets(small_spec(), 0), 2, "flat")
    with pytest.raises(ValueError, match="Bucket 99 is out of range for plan 'flat'"):
        fig_shard_map({"flat": plan}, bucket=99)
    with pytest.raises(ValueError, match="at least one plan"):
        fig_shard_map({})


def test_shard_map_aggregates_ranks_at_1024(big):
    _, bp, plans = big
    b = 2  # k_proj + v_proj: a two-array bucket
    fig = fig_shard_map({"row": plans["row"], "flat": plans["flat"]}, bucket=b)
    shown = [str(r) for r in range(8)] + [str(r) for r in range(1016, 1024)]
    assert list(fig.layout.yaxis.ticktext) == shown and list(fig.layout.yaxis2.ticktext) == shown
    assert "ranks 0–7 and 1016–1023 of 1024 shown" in fig.layout.title.text
    for subplot, plan in enumerate((plans["row"], plans["flat"])):
        real, _ = shard_segments(fig, subplot)
        assert sorted(real) == [int(r) for r in shown]
        for r in (0, 7, 1016, 1023):
            assert [seg[:3] for seg in real[r]] == [(s.path, s.start, s.stop) for s in plan.rank_slices(r) if s.bucket == b]
    assert [s.name for s in fig.layout.shapes] == ["hidden ranks", "hidden ranks"]


def test_shard_map_merges_arrays_past_the_limit(monkeypatch):
    monkeypatch.setattr(shard_map, "MAX_SEGMENTS_PER_RANK", 4)
    bp = plan_buckets(small_spec(), 10**9)  # one bucket of 15 arrays
    plan = plan_shards(bp, 2, "row", pad_rows=True)
    fig = fig_shard_map({"row": plan})
    real, _ = shard_segments(fig, 0)
    assert all(len(segs) <= 4 for segs in real.values())
    assert "arrays merged in groups of 4" in fig.layout.title.text


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(1, 40), min_size=1, max_size=8), cap=st.integers(0, 200), n=st.integers(1, 6),
       layout=st.sampled_from(["row", "flat", "greedy"]))
def test_shard_map_matches_rank_slices_on_random_specs(sizes, cap, n, layout):
    spec = ModelSpec(name="random", params=tuple(ParamSpec(f"p{i}", (s,)) for i, s in enumerate(sizes)))
    bp = plan_buckets(spec, cap)
    plan = plan_shards(bp, n, layout, pad_rows=True)
    b = bp.num_buckets - 1
    real, _ = shard_segments(fig_shard_map({layout: plan}, bucket=b), 0)
    for r in range(n):
        assert [seg[:3] for seg in real[r]] == [(s.path, s.start, s.stop) for s in plan.rank_slices(r) if s.bucket == b]


# --------------------------------------------------------------------------- rank load and metrics


def test_rank_load_totals_equal_rank_bytes():
    bp = plan_buckets(small_spec(), 6 * 1024)
    plans = {"row": plan_shards(bp, 3, "row", pad_rows=True), "flat": plan_shards(bp, 3, "flat"),
             "greedy": plan_shards(bp, 3, "greedy")}
    fig = fig_rank_load(plans)
    for label, plan in plans.items():
        owned = next(t for t in fig.data if t.name == f"{label} owned")
        padding = next(t for t in fig.data if t.name == "padding" and t.yaxis == owned.yaxis)
        np.testing.assert_allclose(owned.y, plan.rank_owned_bytes / MiB)
        np.testing.assert_allclose(padding.base, owned.y)
        np.testing.assert_allclose(np.asarray(owned.y) + np.asarray(padding.y), plan.rank_bytes / MiB)
        (mean,) = [s for s in fig.layout.shapes if s.name == "mean" and s.yref == owned.yaxis]
        assert mean.y0 == pytest.approx(plan.rank_bytes.mean() / MiB)
    assert not [t for t in fig.data if t.type == "scatter"]  # no binning below 64 ranks


def test_rank_load_bins_at_1024(big):
    _, _, plans = big
    fig = fig_rank_load(plans)
    for label, plan in plans.items():
        owned = next(t for t in fig.data if t.name == f"{label} owned")
        padding = next(t for t in fig.data if t.name == "padding" and t.yaxis == owned.yaxis)
        top = next(t for t in fig.data if t.name == "bin max" and t.yaxis == owned.yaxis)
        assert len(owned.y) == 64
        np.testing.assert_allclose(np.asarray(owned.y) + np.asarray(padding.y), plan.rank_bytes.reshape(64, 16).mean(1) / MiB)
        np.testing.assert_allclose(top.y, plan.rank_bytes.reshape(64, 16).max(1) / MiB)
        assert max(top.y) == pytest.approx(plan.rank_bytes.max() / MiB)
    assert "1024 ranks in 64 bins" in fig.layout.title.text


def test_layout_metrics_cells_are_the_summary(big):
    _, _, plans = big
    fig = fig_layout_metrics(plans)
    (table,) = fig.data
    plain = lambda text: text.replace("\u00a0", " ")  # noqa: E731
    header = [plain(h) for h in table.header.values]
    cells = {name: [plain(c) for c in col] for name, col in zip(header, table.cells.values)}
    assert cells["layout"] == list(plans)
    for i, plan in enumerate(plans.values()):
        s = plan.summary()
        assert cells["bytes<br>per rank,<br>maximum"][i] == format_bytes(s["max_rank_bytes"])
        assert cells["bytes<br>per rank,<br>mean"][i] == format_bytes(s["mean_rank_bytes"])
        assert cells["imbalance<br>(maximum<br>/ mean)"][i] == f"{s['imbalance']:.3f}"
        assert cells["padding,<br>all ranks<br>(bytes)"][i] == format_bytes(s["padding_bytes"])
        assert cells["arrays<br>split across<br>ranks"][i] == str(s["num_split_arrays"])
        assert cells["fragments<br>per rank,<br>maximum"][i] == str(s["max_fragments_per_rank"])
        assert cells["fragments<br>per rank,<br>mean"][i] == f"{s['mean_fragments_per_rank']:.1f}"
        assert cells["collectives<br>per step"][i] == str(s["num_collectives_per_step"])
    assert cells["of which"] == ["482 RS + 482 AG"] * 2 + ["482 AR + 723 bcast"]
    assert "RS = reduce-scatter, AG = all-gather, AR = all-reduce, bcast = broadcast" in fig.layout.title.text


@pytest.mark.parametrize("num_plans", [1, 2, 3])
def test_layout_metrics_table_is_sized_to_its_content(big, num_plans):
    """Issue 18: headers were cut ("imbalanc (max/me"), cells with a space blank, the greedy row clipped.

    Headers are full words and break only where written (no space is breakable), each column is as
    wide as its longest line, and the figure is as tall as the header plus every row.
    """
    _, _, plans = big
    fig = fig_layout_metrics(dict(list(plans.items())[:num_plans]))
    (table,) = fig.data
    assert not any(" " in text for text in [*table.header.values, *(c for col in table.cells.values for c in col)])
    assert not [h for h in table.header.values if "/ rank" in h or "max/" in h]  # full words
    longest = [max(len(line) for text in [h, *col] for line in text.split("<br>"))
               for h, col in zip(table.header.values, table.cells.values)]
    assert list(table.columnwidth) == [figures._PAD_PX + figures._CHAR_PX * n for n in longest]
    m = fig.layout.margin
    assert fig.layout.width == int(sum(table.columnwidth)) + m.l + m.r + 4
    assert fig.layout.height >= m.t + table.header.height + num_plans * table.cells.height + m.b
    assert table.cells.height == 8 + figures._LINE_PX  # one line per cell: plotly misplaces multi-line cells drawn hidden
    assert not any("<br>" in c for col in table.cells.values for c in col)


# --------------------------------------------------------------------------- sweeps


def test_buckets_vs_size_lines_are_the_plans():
    spec = small_spec()
    sizes = [1024, 4096, 16384]
    fig = fig_buckets_vs_size(spec, sizes)
    for policy in ("mlx", "pytorch-ddp"):
        count, largest = [t for t in fig.data if t.legendgroup == policy]
        plans = [plan_buckets(spec, s, policy=policy) for s in sizes]
        assert list(count.y) == [p.num_buckets for p in plans]
        np.testing.assert_allclose(largest.y, [p.bucket_bytes.max() / MiB for p in plans])
        np.testing.assert_allclose(count.x, np.array(sizes) / MiB)
    assert fig.layout.xaxis.type == "log" and fig.layout.xaxis2.type == "log"
    with pytest.raises(ValueError, match="> 0"):
        fig_buckets_vs_size(spec, [0, 1024])


def test_buckets_vs_size_log_axes_label_only_powers_of_ten_and_coinciding_lines_are_said():
    """Issue 18: the log y axis read "2, 100, 9...2", and mlx's line hid under pytorch-ddp's unsaid."""
    spec = get_preset("llama-3-8b")
    fig = fig_buckets_vs_size(spec, [2**k * MiB for k in range(-2, 11)])
    for axis in (fig.layout.xaxis, fig.layout.xaxis2, fig.layout.yaxis, fig.layout.yaxis2):
        assert axis.type == "log" and len(axis.tickvals) >= 2
        assert all(np.log10(v) == round(np.log10(v)) for v in axis.tickvals)  # 0.1, 1, 10, ...: no minor labels
        assert list(axis.ticktext) == [f"{v:g}" for v in axis.tickvals]
        assert axis.range[0] <= np.log10(min(axis.tickvals)) and axis.range[1] >= np.log10(max(axis.tickvals))
    mlx, ddp = (next(t for t in fig.data if t.legendgroup == p) for p in ("mlx", "pytorch-ddp"))
    assert mlx.y == ddp.y  # the case under test: the bucket counts coincide for Llama-3-8B
    assert mlx.line.dash == "solid" and ddp.line.dash == "dash" and mlx.line.width > ddp.line.width
    assert mlx.marker.size > ddp.marker.size  # the line below stays visible around the one on top
    assert ddp.name == "pytorch-ddp (dashed, over mlx)"
    assert "bucket counts of mlx and pytorch-ddp coincide" in fig.layout.title.text


def test_padding_vs_shards_lines_are_the_plans():
    bp = plan_buckets(small_spec(), 6 * 1024)
    ns = [1, 3, 8, 64]
    fig = fig_padding_vs_shards(bp, ns)
    for name, label, kwargs in (("row", "row (pad_rows)", dict(pad_rows=True)), ("flat", "flat", {})):
        padding, frags = [t for t in fig.data if t.name == label]
        plans = [plan_shards(bp, n, name, **kwargs) for n in ns]
        np.testing.assert_allclose(padding.y, [p.padding_bytes / MiB for p in plans])
        assert list(frags.y) == [int(p.rank_fragments.max()) for p in plans]
        assert list(padding.x) == ns


# --------------------------------------------------------------------------- every figure


def all_figures(spec, bp, plans):
    two = {"row": plans["row"], "flat": plans["flat"]}
    return {
        "bucket_layout": lambda: fig_bucket_layout(bp),
        "shard_map": lambda: fig_shard_map(two, bucket=1),
        "rank_load": lambda: fig_rank_load(plans),
        "layout_metrics": lambda: fig_layout_metrics(plans),
        "buckets_vs_size": lambda: fig_buckets_vs_size(spec, [MiB, 32 * MiB, 256 * MiB]),
        "padding_vs_shards": lambda: fig_padding_vs_shards(bp, [8, 64, 1024]),
    }


def test_figures_at_1024_are_small_valid_and_deterministic(big):
    spec, bp, plans = big
    for name, build in all_figures(spec, bp, plans).items():
        fig = build()
        text = fig.to_json()
        assert isinstance(fig, go.Figure)
        assert len(text) < 2_000_000, name
        assert len(fig.data) <= 16, name  # few traces, never one per parameter
        assert build().to_json() == text, name  # deterministic
        assert json.loads(go.Figure(fig.to_dict()).to_json()) == json.loads(text), name  # valid plotly
        assert fig.layout.template.layout.plot_bgcolor == "white" and fig.layout.height, name


def test_shard_map_legend_names_every_array_of_the_bucket(big):
    """Issue 18: no legend said which array was which (hover was the only way)."""
    _, bp, plans = big
    b = 2  # k_proj + v_proj
    fig = fig_shard_map({"row": plans["row"], "flat": plans["flat"]}, bucket=b)
    listed = [t.name for t in fig.data if t.showlegend is not False and t.name != "padding"]
    assert listed == [bp.spec.params[i].path for i in bp.bucket(b)]
    for t in fig.data:  # every segment's colour is its legend entry's
        if t.name != "padding":
            assert {row[0] for row in t.customdata} <= set(t.name.split(": ")[-1].split(" … ")) | {t.name}
    many = plan_buckets(small_spec(), 10**9)  # one bucket of 15 arrays: 9 legend groups of consecutive arrays
    fig = fig_shard_map({"row": plan_shards(many, 2, "row", pad_rows=True)}, bucket=0)
    entries = [t.name for t in fig.data if t.name != "padding"]
    assert len(entries) == shard_map.MAX_ARRAY_GROUPS and all(": " in e or "." in e for e in entries)
    assert fig.layout.legend.orientation == "h" and fig.layout.legend.title.text == "arrays of the bucket:"


def test_shard_map_draws_the_picked_rank_whatever_n(big):
    """Issue 18: at N = 1024 only ranks 0-7 and 1016-1023 could be seen."""
    _, bp, plans = big
    fig = fig_shard_map({"row": plans["row"], "flat": plans["flat"]}, bucket=2, rank=517)
    ticks = list(fig.layout.yaxis.ticktext)
    assert ticks == [str(r) for r in range(8)] + ["<b>517</b>"] + [str(r) for r in range(1016, 1024)]
    assert "ranks 0–7, 517 and 1016–1023 of 1024 shown" in fig.layout.title.text
    assert [s.name for s in fig.layout.shapes] == ["hidden ranks"] * 4  # above and below 517, in both subplots
    for subplot, plan in enumerate((plans["row"], plans["flat"])):
        real, _ = shard_segments(fig, subplot)
        assert [seg[:3] for seg in real[517]] == [(s.path, s.start, s.stop) for s in plan.rank_slices(517, 2)]
    with pytest.raises(ValueError, match="rank 1024 is out of range"):
        fig_shard_map({"row": plans["row"]}, bucket=2, rank=1024)


def test_rank_inspector_lists_every_slice_with_its_bytes(big):
    from workbench.views.rank_inspector import rank_inspector_html, rank_slices_table

    _, bp, plans = big
    for layout, plan in plans.items():
        table = rank_slices_table(plan, 517)
        want = [(s.bucket, s.path, s.start, s.stop) for s in plan.rank_slices(517) if s.stop > s.start]
        assert list(table[["bucket", "array", "start", "stop"]].itertuples(index=False, name=None)) == want
        assert int(table.bytes.sum()) == int(plan.rank_owned_bytes[517]), layout
        page = rank_inspector_html(plan, 517)
        assert page.count("<tr>") == len(table) + 1 and f"rank 517 of 1024 ({layout})" in page
    with pytest.raises(ValueError, match="rank 2048"):
        rank_slices_table(plans["row"], 2048)

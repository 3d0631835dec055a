"""Numbers formatted for people, one unit family per view (issue 29, items 8 and 10).

The formatters of :mod:`workbench.core.units`, then every producer the review named: "1 arrays",
"25595.5 ms", "2.06e-05B parameters" / "0.0444B parameters", the "0 (per array)" readout, and raw tables
with 1005617024, 1.005617e+09, NaN, None and 11-16 columns.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest

from workbench.core.units import (
    GiB,
    KiB,
    MiB,
    MISSING,
    byte_unit,
    format_bytes,
    format_column,
    format_count,
    format_number,
    format_params,
    format_seconds,
    plural,
)

RAW = re.compile(r"\d\.\d+e[+-]\d|\bnan\b|\bNaN\b|\bNone\b|<NA>|\d{5,}")  # e-notation, NaN/None, 12345 unseparated


@pytest.mark.parametrize("count, noun, want", [(1, "array", "1 array"), (2, "array", "2 arrays"), (0, "rank", "0 ranks"),
                                               (1024, "rank", "1,024 ranks"), (2, "axis", "2 axes")])
def test_plural(count, noun, want):
    assert plural(count, noun, "axes" if noun == "axis" else None) == want


@pytest.mark.parametrize("seconds, want", [(25.5955, "25.6 s"), (0.358, "358 ms"), (0.0123, "12.3 ms"), (0.00085, "850 µs"),
                                           (0.9996, "1.00 s"), (59.99, "1 min 00 s"), (125, "2 min 05 s"),
                                           (3725, "1 h 02 min"), (None, MISSING), (math.nan, MISSING)])
def test_format_seconds_picks_the_unit_that_reads(seconds, want):
    assert format_seconds(seconds) == want


@pytest.mark.parametrize("count, want", [(20_576, "20.6K parameters"), (44_400_000, "44.4M parameters"),
                                         (8_030_261_248, "8.03B parameters"), (7.5e9, "7.5B parameters"),
                                         (950, "950 parameters"), (1, "1 parameter"), (999_600, "1M parameters")])
def test_format_params_never_writes_a_fraction_of_a_billion(count, want):
    assert format_params(count) == want
    assert format_count(count) == want.split()[0]


@pytest.mark.parametrize("value, want", [(1005617024, "1,005,617,024"), (1.005617e9, "1,005,617,000"), (398.0, "398"),
                                         (1.002965, "1.00"), (0.0123456, "0.0123"), (None, MISSING), (math.nan, MISSING),
                                         (pd.NA, MISSING), (np.int64(146), "146"), (math.inf, "∞"), ("fsdp", "fsdp"),
                                         (4.768372e-07, "4.77 × 10⁻⁷"), (-1.5e-9, "-1.50 × 10⁻⁹"), (0.00012, "0.000120")])
def test_format_number_is_a_table_cell(value, want):
    assert format_number(value) == want


def test_a_column_of_tiny_numbers_is_written_in_powers_of_ten_not_zeros_to_count():
    """Notebook 04's loss differences to DDP read '0.0000004768'."""
    from workbench.core.units import format_column

    assert format_column([0.0, 4.768372e-07, None]) == ["0", "4.77 × 10⁻⁷", MISSING]
    assert not RAW.search(" ".join(format_column([2.5e-8, 1e-7])))


def test_format_column_gives_a_column_one_number_of_decimals():
    assert format_column([1.0, 1.0, 1.002965]) == ["1.000", "1.000", "1.003"]  # 1.003 stays apart from 1
    assert format_column([959.03, 25595.5]) == ["959", "25,596"]
    assert format_column([1005617024, 219, None, math.nan]) == ["1,005,617,024", "219", MISSING, MISSING]


def test_format_bytes_keeps_one_unit_when_asked():
    assert format_bytes(3 * MiB) == "3.00 MiB" and format_bytes(100) == "100 B"
    assert format_bytes(512 * KiB, "MiB") == "0.50 MiB" and format_bytes(3 * GiB, "MiB") == "3072.00 MiB"
    assert byte_unit(959 * MiB) == "MiB" and byte_unit(15 * GiB) == "GiB" and byte_unit(0) == "B"
    with pytest.raises(ValueError, match="unit: unknown 'GB'"):
        format_bytes(1, "GB")


# --- the producers the review named ---------------------------------------------------------------


def _one_array_spec():
    from workbench.core.specs import ModelSpec, ParamSpec

    return ModelSpec("one", [ParamSpec("w", (64, 64), "float32")])


def test_figure_titles_count_one_array_in_the_singular():
    from workbench import plan_buckets, plan_shards
    from workbench.views.plans import fig_bucket_layout, fig_buckets_vs_size
    from workbench.views.shard_map import fig_shard_map

    spec = _one_array_spec()
    buckets = plan_buckets(spec, 32 * MiB)
    titles = [fig_bucket_layout(buckets).layout.title.text, fig_buckets_vs_size(spec, [MiB, 32 * MiB]).layout.title.text,
              fig_shard_map({"row": plan_shards(buckets, 2, "row")}, bucket=0).layout.title.text]
    for title in titles:
        assert "1 array," in title and "1 arrays" not in title, title


def test_memory_titles_write_parameter_counts_for_people():
    from workbench.estimate.memory import compare_strategies
    from workbench.views.memory import fig_memory_breakdown, fig_zero_figure_1

    for psi, want in ((20_576, "20.6K parameters"), (44_400_000, "44.4M parameters")):  # notebook 07's two models
        title = fig_memory_breakdown(list(compare_strategies(psi, 2, ("ddp", "fsdp")).values())).layout.title.text
        assert want in title and "e-0" not in title and "0.0444B" not in title, title
    assert "Psi = 7.5B," in fig_zero_figure_1().layout.title.text


def test_the_layout_explorer_writes_its_cost_in_the_unit_that_reads_and_a_short_zero_label():
    from workbench.views.widgets import LINKS, _size_label, build_layout_explorer

    assert _size_label(0) == "per array" and len(_size_label(0)) <= len("0 (per array)") - 4
    explorer = build_layout_explorer("llama-3-8b", num_shards=8)
    explorer.controls["link"].value = next(name for name in LINKS if name.startswith("Ethernet"))
    cost = explorer.cost.value
    time_text = re.search(r"about (.+) of communication", cost).group(1)
    assert re.fullmatch(r"[\d.,]+ (s|ms|µs)|\d+ min \d\d s", time_text), cost
    number = float(time_text.split()[0].replace(",", ""))
    assert time_text.endswith(" ms") <= (number < 1000), f"{time_text}: past 1,000 ms, written in s"


def test_a_table_a_person_reads_has_units_thousands_no_nan_and_fits():
    from workbench import plan_buckets, plan_shards
    from workbench.core.presets import get_preset
    from workbench.views.tables import MAX_COLUMNS, layouts_table, readable_table

    buckets = plan_buckets(get_preset("qwen3-4b"), 32 * MiB)  # notebook 02's table
    table = layouts_table({layout: plan_shards(buckets, 8, layout) for layout in ("row", "flat", "greedy")})
    text = table.to_string()
    assert not RAW.search(text), text
    assert len(table.columns) <= MAX_COLUMNS and "max rank (MiB)" in table.columns
    assert table.loc["greedy", "imbalance"] == "1.003" and table.loc["row", "max rank (MiB)"] == "959.0"

    raw = pd.DataFrame({"run": ["ddp", None], "median_step_ms": [25595.5, np.nan], "peak_bytes": [1005617024, 512 * KiB],
                        "wall_s": [25.5955, None]})
    shown = readable_table(raw)
    assert not RAW.search(shown.to_string()), shown.to_string()
    assert list(shown.columns) == ["run", "median step (ms)", "peak (MiB)", "wall"]
    assert shown["peak (MiB)"].tolist() == ["959.0", "0.5"] and shown["wall"].tolist() == ["25.6 s", MISSING]
    with pytest.raises(ValueError, match="do not fit a page"):
        readable_table(pd.DataFrame({f"c{i}": [i] for i in range(MAX_COLUMNS + 1)}))
    with pytest.raises(ValueError, match=r"columns: \['nope'\] not in the table"):
        readable_table(raw, columns=["nope"])


def test_the_run_tables_of_notebooks_04_and_05_read_as_people_read_them_through_readable_table():
    """Notebook 04's run summary (NaN where JAX has no array peak), 05's sweep (14 columns, raw byte
    counts) and its PR #3130-shaped table (NaN where a run is missing), from the committed reference runs."""
    from workbench.core.paths import REPO_ROOT
    from workbench.runs.tables import load_runs
    from workbench.studies.runs import summarize_runs
    from workbench.studies.step_time import comm_size_table, pr_step_table
    from workbench.views.tables import readable_table

    runs = REPO_ROOT / "notebooks" / "reference_runs"
    summary = summarize_runs(load_runs(runs / "convergence"))
    assert summary.isna().any().any()  # the raw table has NaN
    shown = readable_table(summary.drop(columns=["run_id", "framework", "strategy"]))  # the label says these two
    sweep = comm_size_table(load_runs(runs / "comm-size"))
    for table in (shown, readable_table(sweep, columns=["strategy", "num_params", "communication_size", "num_buckets",
                                                        "step_ms", "sync_ms", "peak_mib", "predicted_peak_mib"]),
                  readable_table(pr_step_table(sweep))):
        assert not RAW.search(table.to_string()), table.to_string()
    assert {"median step (ms)", "peak rss (MiB)", "peak array (MiB)"} <= set(shown.columns)
    assert (shown["peak array (MiB)"] == MISSING).any() and "3,418,368" in readable_table(sweep, columns=["num_params"]).to_string()


def test_a_multi_level_index_keeps_its_levels_and_a_rate_is_not_a_time():
    """Notebook 05's links read "('jax', 'all_gather')" and a bandwidth "beta gb per: 999 ms"."""
    from workbench.views.tables import readable_table

    t = pd.DataFrame({"framework": ["jax", "mlx"], "kind": ["all_gather", "all_reduce"], "alpha_us": [145.9, 17.3],
                      "beta_gb_per_s": [0.999, 1.66], "step_s": [0.5, 2.0]}).set_index(["framework", "kind"])
    shown = readable_table(t)
    assert list(shown.index.names) == ["framework", "kind"] and shown.index[0] == ("jax", "all_gather")
    assert list(shown.columns) == ["alpha (µs)", "beta (GB/s)", "step"]
    assert list(shown["beta (GB/s)"]) == ["0.999", "1.660"] and list(shown["step"]) == ["500 ms", "2.00 s"]

"""The deck's words are its numbers (issue 29, item 11): each sentence built from the data it states, in one
process, on built tables and stores."""

import pandas as pd
import pytest

from test_runs_view import store_run

from workbench.estimate.grid import estimate_breakdowns
from workbench.runs.spec import RunSpec
from workbench.runs.store import RunStore
from workbench.runs.tables import load_runs
from workbench.studies import deck_findings
from workbench.studies.advice import ADVICE_COLUMNS, AdviceCheck
from workbench.studies.design_review import step_time_table


def test_key_numbers_read_as_a_table_with_no_pandas_dtype_line():
    numbers = pd.Series({"PR #3130: FSDP step-time overhead over DDP, fp32, worst (%)": 3.7,
                         "reference runs, 2 ranks: FSDP optimizer state / DDP's, measured": 0.5})
    table = deck_findings.key_numbers_table(numbers)
    assert list(table.value) == ["3.70", "0.500"]
    assert table.index[0] == ("PR #3130", "FSDP step-time overhead over DDP, fp32, worst (%)")
    assert "dtype" not in table.to_string()


def test_the_step_time_sentence_states_the_tables_range_not_a_few_percent():
    t = step_time_table()
    said = deck_findings.step_time_sentence(t)
    assert f"{t.fsdp_bf16_overhead_pct.max():+.1f}% (worst: {t.fsdp_bf16_overhead_pct.idxmax()})" in said
    assert f"in fp32 {t.fsdp_overhead_pct.min():+.1f}% to {t.fsdp_overhead_pct.max():+.1f}%" in said
    changed = t.assign(fsdp_bf16_overhead_pct=[1.0, 2.0, 40.0])
    assert "+40.0% (worst: 5.4B)" in deck_findings.step_time_sentence(changed)


def test_the_memory_slide_states_its_assumptions_and_who_is_over_the_capacity():
    est = estimate_breakdowns("llama-3-8b", ["ddp", "zero3"], [8], micro_batch_size=1, seq_len=2048)
    said = deck_findings.memory_assumptions(est, micro_batch_size=1, seq_len=2048, capacity_bytes=80e9)
    assert "no fused attention" in said and "no recompute" in said and "2,048 x 2,048 scores" in said
    assert f"{est[0]['activations'] / 1e9:,.1f} GB per rank" in said
    ddp, zero3 = est
    assert f"over it: ddp ({ddp.total_bytes / 1e9:,.1f} GB)." in said and "zero3 (" not in said
    roomy = deck_findings.memory_assumptions(est, micro_batch_size=1, seq_len=2048, capacity_bytes=1e15)
    assert roomy.endswith("every strategy fits.")


def test_row_against_flat_comes_from_the_runs_steps_with_their_spread(tmp_path):
    store = RunStore(tmp_path)
    base = dict(num_ranks=2, steps=8, global_batch=8)
    times = {"ddp": (0.10, 0.10), "fsdp-row": (0.08, 0.08), "fsdp-flat": (0.06, 0.06)}
    for strategy, step_times in times.items():
        store_run(store, RunSpec(strategy=strategy, **base), [3.0 - 0.1 * k for k in range(8)], step_times=step_times)
    table = deck_findings.row_flat_table(load_runs(tmp_path))
    assert table.loc[("mlx", "fsdp-flat"), "median_ms"] == pytest.approx(60.0)
    assert table.loc[("mlx", "fsdp-row"), "over_ddp"] == pytest.approx(0.8)
    said = deck_findings.row_flat_sentences(table)
    assert said == ["mlx: flat's median step is 0.75x row's (60 against 80 ms, over 8 steps); the difference is "
                    "larger than the runs' spread"]
    wide = table.assign(p25_ms=table.median_ms - 30, p75_ms=table.median_ms + 30)
    assert deck_findings.row_flat_sentences(wide)[0].endswith("within the runs' spread of 60 ms: no measured difference")
    fig = deck_findings.fig_row_flat(table)
    assert list(fig.data[0].x) == ["ddp", "fsdp-row", "fsdp-flat"] and list(fig.data[0].error_y.array) == [0, 0, 0]


def advice_check(medians, spread):
    rows = [[size, 1, 1.0, 1.0, m, m - spread / 2, m + spread / 2, size == 4, m == min(medians)]
            for size, m in zip([1, 4, 16], medians)]
    advice = type("Advice", (), {"communication_size": 4 * 2**20})()  # the check reads only its size
    return AdviceCheck(advice=advice, table=pd.DataFrame(rows, columns=ADVICE_COLUMNS), best_measured=4 * 2**20,
                       gap=0.0, label="test")


def test_the_advice_says_no_reliable_pick_when_the_spread_hides_the_difference():
    tight = advice_check([110.0, 100.0, 120.0], spread=4.0)
    assert tight.reliable and tight.verdict().endswith(": a reliable pick")
    noisy = advice_check([110.0, 100.0, 120.0], spread=16.0)
    assert not noisy.reliable
    assert noisy.verdict() == ("4 MiB and 1 MiB, the fastest two, differ by 10 ms; the runs' spread is 16 ms "
                               "(interquartile range over steps): no reliable pick between them")
    assert noisy.summary().loc["pick", "answer"].startswith("no reliable pick")


def test_the_recommendation_cites_the_key_numbers_it_was_given():
    from workbench.estimate.cases import explain_qwen_3_7b
    from workbench.studies.design_review import key_numbers, reference_runs_dir
    from workbench.studies.memory import memory_validation

    gap, validation = explain_qwen_3_7b(), memory_validation(load_runs(reference_runs_dir("memory")))
    said = deck_findings.recommendation(gap, validation, advice_check([110.0, 100.0, 120.0], spread=16.0))
    k = key_numbers(gap, validation)
    worst = k["PR #3130: FSDP step-time overhead over DDP, bf16, worst (%)"]
    assert f"{worst:+.1f}% in bf16" in said and "a few percent" not in said
    assert "advised 4 MiB" in said and "no reliable pick between them" in said

"""Run tables and figures read exactly what the store holds; the live display draws the store's steps."""

import numpy as np
import pandas as pd

from workbench.runs.spec import RunSpec
from workbench.runs.store import RunStore
from workbench.runs.tables import load_runs
from workbench.studies.runs import ddp_twin, fig_diff_to_ddp, fig_loss_curves, fig_step_time_memory, summarize_runs
from workbench.views.progress import LiveProgress


def store_run(store, spec, losses, *, step_times=(0.02, 0.03), peak=2**20, done=True):
    handle = store.create(spec.to_dict())
    for step, loss in enumerate(losses):
        handle.append_steps([{"step": step, "rank": r, "loss": loss + (0.1 if r else -0.1), "grad_norm": 1.0,
                              "step_time_s": step_times[r], "peak_rss_bytes": peak * (r + 1)} for r in range(2)])
    if done:
        handle.finish({})
    return handle.run_id


def test_summary_means_ranks_takes_slowest_rank_and_compares_to_the_ddp_twin(tmp_path):
    store = RunStore(tmp_path)
    base = dict(num_ranks=2, steps=4, global_batch=8)
    ddp = store_run(store, RunSpec(strategy="ddp", **base), [3.0, 2.5, 2.0, 1.5])
    row = store_run(store, RunSpec(strategy="fsdp-row", **base), [3.0, 2.5, 2.0, 1.5 + 1e-7])
    other = store_run(store, RunSpec(strategy="fsdp-flat", **{**base, "steps": 5}), [3.0, 2.0, 1.0, 0.5])
    loaded = load_runs(tmp_path)
    assert ddp_twin(loaded.runs, row) == ddp
    assert ddp_twin(loaded.runs, other) is None  # steps differ: no DDP twin stored
    summary = summarize_runs(loaded).set_index("run_id")
    assert summary.loc[row, "final_loss"] == np.float64(1.5 + 1e-7)  # mean of 1.4+1e-7 and 1.6+1e-7
    assert abs(summary.loc[row, "max_abs_loss_diff_to_ddp"] - 1e-7) < 1e-12
    assert summary.loc[ddp, "median_step_ms"] == 30.0  # the slowest rank ends the step
    assert summary.loc[ddp, "peak_rss_mib"] == 2.0 and summary.loc[ddp, "peak_array_mib"] is None
    assert np.isnan(summary.loc[other, "max_abs_loss_diff_to_ddp"])
    curves = fig_loss_curves(loaded, floor_nats=0.7)
    assert {t.name for t in curves.data} == {"mlx ddp", "mlx fsdp-row", "mlx fsdp-flat"}
    assert list(curves.data[0].y) == [3.0, 2.5, 2.0, 1.5]
    diff = fig_diff_to_ddp(loaded)
    assert [t.name for t in diff.data] == ["mlx fsdp-row"] and max(diff.data[0].y) < 2e-7
    bars = fig_step_time_memory(summarize_runs(loaded))
    assert sorted(bars.data[0].y) == [30.0, 30.0, 30.0]


def test_the_summary_and_steady_steps_leave_out_the_same_warm_up_steps(tmp_path):
    """One warm-up selection (studies.runs.after_warmup): the summary's median step and step_time's steady_steps
    keep the same steps, the first WARMUP_STEPS left out, or all of them where a run has no more."""
    from workbench.studies.runs import WARMUP_STEPS, after_warmup
    from workbench.studies.step_time import steady_steps

    store = RunStore(tmp_path)
    slowest = {5: [9.0, 7.0, 0.01, 0.03, 0.02], 2: [9.0, 7.0]}  # steps of the run -> the slowest rank's times
    ids = {}
    for n, times in slowest.items():
        handle = store.create(RunSpec(num_ranks=2, steps=n, global_batch=8).to_dict())
        handle.append_steps([{"step": s, "rank": r, "loss": 1.0, "grad_norm": 1.0, "step_time_s": t / (2 - r)}
                             for s, t in enumerate(times) for r in range(2)])
        handle.finish({})
        ids[n] = handle.run_id
    loaded = load_runs(tmp_path)
    summary = summarize_runs(loaded).set_index("run_id")
    kept = {n: steady_steps(loaded.steps[loaded.steps.run_id == rid], "step_time_s") for n, rid in ids.items()}
    assert WARMUP_STEPS == 2 and list(kept[5].index) == [2, 3, 4] and list(kept[2].index) == [0, 1]
    assert list(kept[5]) == [0.01, 0.03, 0.02]  # the slowest rank's
    for n, rid in ids.items():
        assert summary.loc[rid, "median_step_ms"] == kept[n].median() * 1e3
    assert summary.loc[ids[5], "median_step_ms"] == 20.0 and summary.loc[ids[2], "median_step_ms"] == 8000.0
    frame = pd.DataFrame({"loss": [3.0, 2.0, 1.0]}, index=pd.Index([0, 1, 2], name="step"))
    assert list(after_warmup(frame).index) == [2] and list(after_warmup(frame.loss.iloc[:2]).index) == [0, 1]


def test_live_progress_draws_the_stored_steps(tmp_path):
    spec = RunSpec(num_ranks=2, steps=4, global_batch=8)
    live = LiveProgress(spec, tmp_path, floor_nats=1.0, redraw_s=0)
    live(0)
    assert live.bar.value == 0 and list(live.figure.data[0].y) == []
    store_run(RunStore(tmp_path), spec, [3.0, 2.0], done=False)
    live(2)
    assert live.bar.value == 2 and list(live.figure.data[0].y) == [3.0, 2.0]
    assert "step 2/4" in live.status.value


def test_the_findings_are_the_runs_numbers_and_say_when_frameworks_differ(tmp_path):
    """Issue 29 item 7: notebook 04's prose said "the frameworks differ" under a figure saying all runs coincide,
    and "FSDP close to DDP" beside 694 ms against 358 ms. Its sentences are now computed from the runs."""
    from workbench.studies.runs import convergence_findings, cost_findings

    store = RunStore(tmp_path)
    base = dict(num_ranks=2, steps=4, global_batch=8)
    losses = [3.0, 2.5, 2.0, 1.5]
    for fw in ("mlx", "jax"):
        store_run(store, RunSpec(framework=fw, strategy="ddp", **base), losses, step_times=(0.3, 0.358))
        store_run(store, RunSpec(framework=fw, strategy="fsdp-row", **base), losses, step_times=(0.5, 0.694))
    loaded = load_runs(tmp_path)
    said = convergence_findings(loaded, floor_nats=1.2)
    assert said[0].startswith("All 4 runs draw one loss curve")
    assert "2 of 2 sharded runs equal their DDP twin exactly" in said[1]
    assert said[2] == "Final losses 1.5 nats against the data's floor of 1.200."
    summary = summarize_runs(loaded)
    cost = cost_findings(summary)
    assert cost[0].startswith("jax: sharded steps take 1.94x DDP's 358 ms (694 ms; slowest jax fsdp-row)")
    # framework and strategy are columns of their own: the findings read them, not the label's words
    assert sorted(zip(summary.framework, summary.strategy)) == [("jax", "ddp"), ("jax", "fsdp-row"),
                                                                ("mlx", "ddp"), ("mlx", "fsdp-row")]
    names = {key: f"run {k}" for k, key in enumerate(zip(summary.framework, summary.strategy))}  # no words to parse
    renamed = summary.assign(run=[names[key] for key in zip(summary.framework, summary.strategy)])
    assert len(cost) == 2 and cost_findings(renamed) == [
        c.replace(f"slowest {fw} fsdp-row", f"slowest {names[(fw, 'fsdp-row')]}") for fw, c in zip(("jax", "mlx"), cost)]
    empty = summarize_runs(load_runs(tmp_path / "none"))
    assert list(empty.columns[:4]) == ["run", "run_id", "framework", "strategy"] and cost_findings(empty) == []
    # JAX's curve apart from MLX's: said per framework, with the gap between their DDP runs
    store_run(store, RunSpec(framework="jax", strategy="ddp", **{**base, "data_seed": 1}), losses, step_times=(0.3, 0.3))
    tmp = tmp_path / "apart"
    apart = RunStore(tmp)
    for fw, shift in (("mlx", 0.0), ("jax", 0.01)):
        for s in ("ddp", "fsdp-row"):
            store_run(apart, RunSpec(framework=fw, strategy=s, **base), [v + shift for v in losses])
    said = convergence_findings(load_runs(tmp))
    assert said[:3] == ["jax: the 2 runs draw one curve.", "mlx: the 2 runs draw one curve.",
                        "The frameworks' DDP runs differ by at most 0.01 nats per token at any step."]


def test_step_time_and_memory_are_two_panels_each_from_zero_with_its_numbers(tmp_path):
    store = RunStore(tmp_path)
    base = dict(num_ranks=2, steps=4, global_batch=8)
    store_run(store, RunSpec(strategy="ddp", **base), [3.0, 2.0, 1.5, 1.2], step_times=(0.3, 0.358), peak=300 * 2**20)
    fig = fig_step_time_memory(summarize_runs(load_runs(tmp_path)))
    (time, rss) = fig.data
    assert (time.xaxis, time.yaxis, rss.xaxis, rss.yaxis) == ("x", "y", "x2", "y2")  # one axis each, no overlay
    assert list(time.y) == [358.0] and list(time.text) == ["358"] and list(rss.text) == ["600"]
    assert fig.layout.yaxis.rangemode == fig.layout.yaxis2.rangemode == "tozero" and fig.layout.yaxis2.overlaying is None

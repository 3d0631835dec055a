"""Run tables and figures read exactly what the store holds; the live display draws the store's steps."""

import numpy as np

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


def test_live_progress_draws_the_stored_steps(tmp_path):
    spec = RunSpec(num_ranks=2, steps=4, global_batch=8)
    live = LiveProgress(spec, tmp_path, floor_nats=1.0, redraw_s=0)
    live(0)
    assert live.bar.value == 0 and list(live.figure.data[0].y) == []
    store_run(RunStore(tmp_path), spec, [3.0, 2.0], done=False)
    live(2)
    assert live.bar.value == 2 and list(live.figure.data[0].y) == [3.0, 2.0]
    assert "step 2/4" in live.status.value

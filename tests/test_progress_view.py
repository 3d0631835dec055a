"""Run progress reads true (issue 18): a done run's bar is full, steps are whole, the sweep has one bar with an ETA."""

from types import SimpleNamespace

from workbench.runs.spec import RunSpec
from workbench.launch.sweep import SweepClock
from workbench.views.progress import LiveProgress, SweepProgress


def test_a_done_run_fills_its_bar_even_when_the_last_steps_came_after_the_last_poll(tmp_path):
    spec = RunSpec(num_ranks=2, steps=6, global_batch=8)
    live = LiveProgress(spec, tmp_path, redraw_s=0)
    live(4)  # the last poll saw 4 of 6 steps (the bar stopped at 67% in the screenshot)
    live.finish(SimpleNamespace(status="done", seconds=1.0, error=None))
    assert live.bar.value == live.bar.max == 6 and live.status.value.startswith("done")
    failed = LiveProgress(spec, tmp_path, redraw_s=0)
    failed(4)
    failed.finish(SimpleNamespace(status="failed", seconds=1.0, error="boom"))
    assert failed.bar.value == 4 and failed.bar.bar_style == "danger"  # a failed run shows where it stopped


def test_the_step_axis_has_whole_steps_only(tmp_path):
    live = LiveProgress(RunSpec(num_ranks=2, steps=3, global_batch=8), tmp_path)
    axis = live.figure.layout.xaxis
    assert axis.dtick == 1 and axis.tick0 == 0 and axis.title.text == "step"  # ticks on whole steps only
    long = LiveProgress(RunSpec(num_ranks=2, steps=95, global_batch=8), tmp_path)
    assert long.figure.layout.xaxis.dtick == 10  # whole steps, about ten ticks


def test_the_sweep_bar_counts_runs_and_pins_its_eta_until_done(tmp_path):
    sweep = SweepProgress(2)
    clock = SweepClock(2)
    live = LiveProgress(RunSpec(num_ranks=2, steps=4, global_batch=8), tmp_path, redraw_s=0, sweep=sweep)
    clock.run_started()
    live(1, *clock.eta(1, 4))
    assert "0 of 2 runs done; now: " in sweep.status.value and "position:fixed" in sweep.pinned.value
    sweep.update(live.label, 90.0)
    assert "left" in sweep.status.value and "sweep: 0/2 runs done" in sweep.pinned.value
    sweep.run_finished()
    assert sweep.bar.value == 1 and sweep.pinned.value  # still pinned while a run is left
    sweep.run_finished()
    assert sweep.bar.value == sweep.bar.max == 2 and sweep.pinned.value == "" and sweep.bar.bar_style == "success"


def test_coinciding_loss_curves_are_said_and_drawn_apart(tmp_path):
    """Issue 18: 8 runs in the legend, one line visible, nothing saying they coincide."""
    from test_runs_view import store_run

    from workbench.runs.store import RunStore
    from workbench.runs.tables import load_runs
    from workbench.studies.runs import fig_loss_curves, fig_step_time_memory, summarize_runs

    store = RunStore(tmp_path)
    base = dict(num_ranks=2, steps=4, global_batch=8)
    for strategy in ("ddp", "fsdp-row", "fsdp-flat"):
        store_run(store, RunSpec(strategy=strategy, **base), [3.0, 2.5, 2.0, 1.5])
    store_run(store, RunSpec(strategy="fsdp-full", **base), [3.0, 2.4, 2.0, 1.4])
    fig = fig_loss_curves(load_runs(tmp_path))
    assert "3 runs coincide (mlx ddp, mlx fsdp-flat, mlx fsdp-row)" in fig.layout.title.text
    assert len({t.line.dash for t in fig.data}) == len(fig.data) == 4  # every line its own dash pattern
    widths = [t.line.width for t in fig.data]
    assert widths == sorted(widths, reverse=True) and widths[0] > widths[-1]  # the first drawn stays visible
    assert fig.layout.xaxis.dtick == 1 and fig.layout.xaxis.tick0 == 0  # whole steps (a "d" format printed 0, 1, 1, 2)
    bars = fig_step_time_memory(summarize_runs(load_runs(tmp_path)))
    # two panels, no legend to lie over an axis' tick labels (a legend at the right once read "432" as "43")
    assert bars.layout.showlegend is False and bars.layout.yaxis2.title.text == "MiB"
    assert bars.layout.xaxis2.domain[0] > bars.layout.xaxis.domain[1]

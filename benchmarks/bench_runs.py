"""Run-harness figures (prints them; asserts nothing).

Targets (issue 4): a cluster of 2 engines ready in at most 15 s; the harness (records,
progress, watchdog) adds at most 2% to step time; the full notebook 04 (3 strategies x 2
frameworks, 200 steps) within 10 minutes on 2 cores (timed by running the README's main
command on it: ``time python3 -m workbench build notebooks/04_convergence.ipynb``).

    python3 benchmarks/bench_runs.py [--runs runs/convergence]

The harness's cost is measured where it is paid: on each rank, per step (appending the
step row to the store, reading peak memory), and in the driver, per second (the
watchdog's poll of the steps file, the progress redraw). Both are set against the median
step times of the stored runs of notebook 04.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from workbench.launch.driver import StepWatchdog
from workbench.launch.engines import start_engines
from workbench.launch.plan import plan_launch
from workbench.ranks.probes import peak_array_bytes, peak_rss_bytes
from workbench.runs.spec import RunSpec
from workbench.runs.store import RunStore
from workbench.runs.tables import load_runs
from workbench.studies.runs import summarize_runs


def per_call_s(fn, n: int = 2000) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=Path, default=Path(__file__).resolve().parent.parent / "runs" / "convergence")
    args = parser.parse_args()

    ready = []
    for framework in ("mlx", "jax", "mlx"):
        with start_engines(plan_launch(2, framework=framework)) as engines:
            ready.append(engines.started_s)
    print(f"2 engines ready: {', '.join(f'{s:.1f}' for s in ready)} s (median {statistics.median(ready):.1f} s; target <= 15 s)")

    with tempfile.TemporaryDirectory() as tmp:
        spec = RunSpec(steps=200)
        handle = RunStore(Path(tmp)).create(spec.to_dict())
        row = {"step": 0, "rank": 0, "loss": 1.0, "grad_norm": 1.0, "step_time_s": 0.01}
        rank_cost = per_call_s(lambda: handle.append_steps([{**row, "peak_rss_bytes": peak_rss_bytes(),
                                                               "peak_array_bytes": peak_array_bytes()}]))
        watchdog = StepWatchdog(handle.folder / "steps.jsonl", 60, 60, None, 2)
        poll_cost = per_call_s(watchdog, 20000)
    driver_share = poll_cost * 10  # polls every 0.1 s: seconds of CPU per second of run
    print(f"harness on each rank: {rank_cost * 1e3:.3f} ms per step (store append + peak memory)")
    print(f"harness in the driver: {poll_cost * 1e6:.1f} us per watchdog poll, 10 polls/s = {driver_share:.4%} of a core")

    if not args.runs.exists():
        print(f"(no stored runs in {args.runs}: run notebook 04 at full size to set these against step times)")
        return
    summary = summarize_runs(load_runs(args.runs))
    print(f"\nagainst the stored runs of {args.runs} (median step after warm-up, slowest rank):")
    for _, r in summary.iterrows():
        step_s = r.median_step_ms / 1e3
        share = (rank_cost + driver_share * step_s) / step_s
        print(f"  {r.run:<15} {r.median_step_ms:8.1f} ms/step   harness {share:6.2%}   (target <= 2%)")


if __name__ == "__main__":
    main()

"""Planner and explorer speed: prints figures, asserts nothing (targets are in the issue).

Targets: planning buckets + shards for all tensors of Llama-3-70B at N = 8, 64, 1024, per
layout, at most 20 ms each; one explorer update (controls changed -> figures updated, Python
side) at most 100 ms at every N.

    python3 benchmarks/bench_planners.py
"""

from __future__ import annotations

import statistics
import time

from workbench import MiB, plan_buckets, plan_shards
from workbench.core.presets import get_preset


def best_of(fn, repeat: int = 7) -> tuple[float, float]:
    """Median and best wall time of ``fn()`` in milliseconds."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times)


def bench_planning() -> None:
    spec = get_preset("llama-3-70b")
    print(f"Llama-3-70B: {len(spec)} arrays, {spec.num_params:,} parameters, communication_size 32 MiB")
    print(f"{'N':>6} {'layout':>7} {'buckets+shards ms (median / best)':>36} {'row slices':>11}")
    for n in (8, 64, 1024):
        for layout in ("row", "flat", "greedy"):
            med, best = best_of(lambda: plan_shards(plan_buckets(spec, 32 * MiB), n, layout))
            plan = plan_shards(plan_buckets(spec, 32 * MiB), n, layout)
            slices = plan.rank_fragments.sum()
            print(f"{n:>6} {layout:>7} {med:>25.2f} / {best:.2f} {slices:>11,}")


def bench_explorer() -> None:
    from workbench.views.widgets import build_layout_explorer

    explorer = build_layout_explorer("llama-3-70b", communication_size=32 * MiB, num_shards=8, layout="row")
    controls = explorer.controls
    print("\nExplorer update (set a control -> plans and figures recomputed and copied into the FigureWidgets):")
    for n in (8, 64, 1024):
        for layout in ("row", "flat", "greedy"):
            def change(n=n, layout=layout):
                controls["num_shards"].value = 1 if controls["num_shards"].value != 1 else 2
                controls["layout"].value = layout
                t0 = time.perf_counter()
                controls["num_shards"].value = n
                return (time.perf_counter() - t0) * 1e3

            times = [change() for _ in range(5)]
            print(f"  N={n:>5} layout={layout:<6} {statistics.median(times):7.1f} ms median, {max(times):7.1f} ms max")
    sizes = [value for _, value in controls["communication_size"].options]
    times = []
    for value in sizes[1:8]:
        t0 = time.perf_counter()
        controls["communication_size"].value = value
        times.append((time.perf_counter() - t0) * 1e3)
    print(f"  communication_size changes at N={controls['num_shards'].value}: "
          f"{statistics.median(times):.1f} ms median, {max(times):.1f} ms max")


if __name__ == "__main__":
    bench_planning()
    bench_explorer()

"""FSDP vs DDP step time and optimizer-state bytes on real MLX ring processes (prints figures).

Targets (issue 17): on CPU ring ranks, strategies interleaved in one run, fp32 AdamW,
communication_size 32 MiB, the ``"auto"`` reduce-scatter: FSDP-row and FSDP-flat at or below
1.00x DDP's step time at 2 ranks (25.2M parameters, the default) and at 4 ranks
(``--ranks 4 --hidden 1024 --steps 8``); optimizer-state bytes per rank over DDP's = 1/N.

    python3 benchmarks/bench_fsdp_step.py [--ranks 2] [--steps 12] [--repeats 3] [--phases]
        [--strategies ddp,fsdp-row,fsdp-flat]

Each repeat is a fresh launch. Per repeat, a step's time is the slowest rank's, and a strategy's
figure is the median over steps after two warm-up steps; the table gives the median over
repeats and the spread (lowest-highest) of the repeats. ``--phases`` adds the FSDP step cut into
its parts, each evaluated alone (``workbench.ranks.mlx_step_timing.phased_step``), next to DDP.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from workbench.launch.plan import plan_launch, run_worker
from workbench.studies.design_review import step_time_table

WARMUP_STEPS = 2


def steady(ranks: list[dict], series: str, name: str) -> float:
    """Median over steps after warm-up of the slowest rank's seconds."""
    steps = len(ranks[0][series][name])
    return statistics.median(max(r[series][name][i] for r in ranks) for i in range(WARMUP_STEPS, steps))


def spread(values: list[float], scale: float = 1.0, fmt: str = "{:.0f}") -> str:
    return (fmt + " ({}-{})").format(statistics.median(values) * scale, fmt.format(min(values) * scale),
                                     fmt.format(max(values) * scale))


def run_once(args, tmp: Path) -> list[dict]:
    extra = ["--phases"] if args.phases else []
    return run_worker(plan_launch(args.ranks), "workbench.ranks.mlx_step_timing", tmp, "--steps", str(args.steps),
                      "--hidden", str(args.hidden), "--layers", str(args.layers), "--strategies", args.strategies,
                      "--communication-size", str(args.communication_size), *extra, timeout_s=1800)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--communication-size", type=int, default=32 * 2**20)
    parser.add_argument("--strategies", default="ddp,fsdp-row,fsdp-flat")
    parser.add_argument("--phases", action="store_true")
    args = parser.parse_args()
    runs = []
    for rep in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            runs.append(run_once(args, Path(tmp)))
        print(f"repeat {rep + 1}/{args.repeats} done", flush=True)
    r0 = runs[0][0]
    names = list(r0["times_s"])
    med = {name: [steady(ranks, "times_s", name) for ranks in runs] for name in names}
    ratio = {name: [t / d for t, d in zip(med[name], med["ddp"])] for name in names} if "ddp" in med else {}
    print(f"MLX ring backend, {args.ranks} ranks, {r0['num_params'] / 1e6:.1f}M parameters (fp32, AdamW), "
          f"communication_size {args.communication_size / 2**20:g} MiB, reduce-scatter 'auto' = "
          f"{r0['reduce_scatter_transport']!r}, {args.steps} interleaved steps (first {WARMUP_STEPS} dropped), "
          f"{args.repeats} repeats: median (lowest-highest) of the repeats")
    print(f"{'strategy':<20}{'step ms':>22}{'/ DDP':>24}{'opt state / DDP':>18}")
    for name in names:
        state = r0["optimizer_state_bytes"][name] / r0["optimizer_state_bytes"].get("ddp", 1)
        rat = spread(ratio[name], fmt="{:.3f}") if ratio else "-"
        print(f"{name:<20}{spread(med[name], 1e3):>22}{rat:>24}{state:>18.3f}")
    if args.phases and r0["phases_s"]:
        print("\nThe step part by part (each part evaluated alone; ms, median over repeats; DDP's "
              "reduce_scatter is its all-reduce):")
        layouts = list(r0["phases_s"])
        print(f"{'part':<16}" + "".join(f"{lay:>14}" for lay in layouts))
        totals = dict.fromkeys(layouts, 0.0)
        for part in r0["phases_s"][layouts[0]]:
            row = []
            for lay in layouts:
                v = statistics.median(
                    statistics.median(max(r["phases_s"][lay][part][i] for r in ranks)
                                      for i in range(WARMUP_STEPS, args.steps)) for ranks in runs)
                totals[lay] += v
                row.append(f"{v * 1e3:>14.1f}")
            print(f"{part:<16}" + "".join(row))
        print(f"{'sum of parts':<16}" + "".join(f"{totals[lay] * 1e3:>14.1f}" for lay in layouts))
    peak = max(r["peak_memory_bytes"] for ranks in runs for r in ranks)
    print(f"peak memory per rank (every strategy resident at once): {peak / 2**20:.0f} MiB")
    print()
    print("MLX PR #3130 (8 B200 GPUs, NCCL), step time in ms:")
    print(step_time_table().to_string())


if __name__ == "__main__":
    main()

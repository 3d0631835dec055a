"""FSDP vs DDP step time and optimizer-state bytes on real MLX ring processes (prints figures).

Targets (issue 3): on 2 CPU ranks, ~25M parameters, communication_size 32 MiB, strategies
interleaved in one run: FSDP / DDP step time <= 1.05 with the send/recv ring
reduce-scatter; the same ratio with the all_sum fallback; optimizer-state bytes per rank
over DDP's = 1/N.

    python3 benchmarks/bench_fsdp_step.py [--ranks 2] [--steps 12]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from workbench.launch.plan import plan_launch, run_worker
from workbench.studies.design_review import step_time_table


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=6)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ranks = run_worker(plan_launch(args.ranks), "workbench.ranks.mlx_step_timing", Path(tmp), "--steps", str(args.steps),
                           "--hidden", str(args.hidden), "--layers", str(args.layers), timeout_s=1800)
    r0 = ranks[0]
    print(f"MLX ring backend, {args.ranks} ranks, {r0['num_params'] / 1e6:.1f}M parameters (fp32, AdamW), "
          f"communication_size 32 MiB, {args.steps} interleaved steps (first 2 dropped as warm-up)")
    # A step ends when the slowest rank ends: take the max over ranks, then the median over steps.
    med = {}
    for name in r0["times_s"]:
        per_step = [max(r["times_s"][name][i] for r in ranks) for i in range(2, args.steps)]
        med[name] = statistics.median(per_step)
    print(f"{'strategy':<18}{'step ms':>10}{'/ DDP':>8}{'opt state / rank':>20}{'/ DDP':>8}")
    for name, t in med.items():
        state = r0["optimizer_state_bytes"][name]
        print(f"{name:<18}{t * 1e3:>10.1f}{t / med['ddp']:>8.3f}{state / 2**20:>16.1f} MiB"
              f"{state / r0['optimizer_state_bytes']['ddp']:>8.3f}")
    print(f"peak memory per rank (every strategy resident at once): {max(r['peak_memory_bytes'] for r in ranks) / 2**20:.0f} MiB")
    print()
    print("MLX PR #3130 (8 B200 GPUs, NCCL), step time in ms:")
    print(step_time_table().to_string())


if __name__ == "__main__":
    main()

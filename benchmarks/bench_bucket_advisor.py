"""The bucket-size advisor against measurement, on real MLX ring processes (prints figures).

Issue 17: :func:`workbench.estimate.advisor.recommend_communication_size` takes the machine's fitted
alpha-beta links, the model's spec, the layout and N, and recommends a ``communication_size``. Here
each repeat launches N ranks that first time all-gather and reduce-scatter alone over message sizes
(the collective benchmark's rank, :func:`workbench.ranks.collective_timing.bench_rank`), then run FSDP
steps at every candidate size, interleaved (``workbench.ranks.mlx_step_timing``). The links are fitted
from the first part (``fit_alpha_beta``, relative residuals, as ``studies.step_time.fit_links``); the
advice is checked against the second: the measured step time at the recommended size should be within
5% of the best measured.

    python3 benchmarks/bench_bucket_advisor.py [--ranks 2] [--hidden 512] [--layers 16] [--repeats 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from workbench.core.specs import ModelSpec, ParamSpec
from workbench.core.units import KiB, MiB
from workbench.estimate.advisor import recommend_communication_size
from workbench.estimate.comm import bus_factor, fit_alpha_beta, ring_steps
from workbench.launch.plan import plan_launch
from workbench.launch.local_run import run_worker

WARMUP_STEPS = 2
DEFAULT_SIZES = (256 * KiB, 1 * MiB, 2 * MiB, 4 * MiB, 8 * MiB, 32 * MiB)
LINK_SIZES = tuple(4**k * 64 * KiB for k in range(6))  # 64 KiB to 64 MiB


def mlp_spec(hidden: int, layers: int) -> ModelSpec:
    """The benchmark's MLP (``workbench.models.mlx_mlp.build_params``), in MLX's flatten order."""
    params = []
    for i in range(layers):
        params += [ParamSpec(f"layers.{i}.weight", (hidden, hidden)), ParamSpec(f"layers.{i}.bias", (hidden,))]
    return ModelSpec(f"mlp-{hidden}x{layers}", tuple(params))


def fit_links(runs: list[list[dict]], n: int) -> dict:
    """Alpha-beta per kind from every repeat's link timings: a size's time is the slowest rank's median."""
    links = {}
    for kind in ("all_gather", "reduce_scatter"):
        sizes, times = [], []
        for ranks in runs:
            for key in ranks[0]["link_times_s"]:
                k, size = key.split(":")
                if k == kind:
                    sizes.append(bus_factor(kind, n) * int(size))
                    times.append(max(statistics.median(r["link_times_s"][key]) for r in ranks))
        links[kind] = fit_alpha_beta(sizes, times, ring_steps(kind, n), relative=True)
    return links


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--layout", default="row", choices=["row", "flat"])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES))
    args = parser.parse_args()
    n, sizes = args.ranks, sorted(args.sizes)
    runs = []
    for rep in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            runs.append(run_worker(
                plan_launch(n), "workbench.ranks.mlx_step_timing", Path(tmp), "--steps", str(args.steps),
                "--hidden", str(args.hidden), "--layers", str(args.layers), "--strategies", f"fsdp-{args.layout}",
                "--communication-size", *map(str, sizes), "--link-sizes", *map(str, LINK_SIZES), timeout_s=1800))
        print(f"repeat {rep + 1}/{args.repeats} done", flush=True)
    spec = mlp_spec(args.hidden, args.layers)
    assert spec.num_params == runs[0][0]["num_params"], "the spec is not the benchmark's model"
    links = fit_links(runs, n)
    advice = recommend_communication_size(spec, n, links, sizes=sizes, layout=args.layout)
    measured = {}
    for s in sizes:
        name = f"fsdp-{args.layout}@{s}"
        measured[s] = [statistics.median(max(r["times_s"][name][i] for r in ranks)
                                         for i in range(WARMUP_STEPS, args.steps)) for ranks in runs]
    med = {s: statistics.median(v) for s, v in measured.items()}
    best = min(med, key=med.get)
    print(f"\nMLX ring, {n} ranks, {spec.name} ({spec.num_params / 1e6:.1f}M fp32 parameters, "
          f"{spec.nbytes / MiB:.1f} MiB), fsdp-{args.layout}, {args.repeats} repeats")
    for kind, link in links.items():
        print(f"  fitted {kind}: alpha {link.alpha_s * 1e3:.3f} ms per ring step, beta {link.beta_bytes_per_s / 1e9:.2f} GB/s")
    print(f"{'size':>10}{'buckets':>9}{'pred. sync ms':>15}{'measured step ms':>24}{'step - pred. sync':>19}")
    for p in advice.curve:
        v = measured[p.communication_size]
        mark = " <- advised" if p.communication_size == advice.communication_size else ""
        mark += " <- best measured" if p.communication_size == best else ""
        print(f"{p.communication_size / MiB:>7.2f}MiB{p.num_buckets:>9}{p.predicted_sync_s * 1e3:>15.1f}"
              f"{f'{med[p.communication_size] * 1e3:.1f} ({min(v) * 1e3:.0f}-{max(v) * 1e3:.0f})':>24}"
              f"{(med[p.communication_size] - p.predicted_sync_s) * 1e3:>19.1f}{mark}")
    exact = recommend_communication_size(spec, n, links, sizes=sizes, layout=args.layout, tolerance=0.0)
    for label, adv in (("advised (knee, 1%)", advice), ("least predicted (tolerance 0)", exact)):
        gap = med[adv.communication_size] / med[best] - 1
        print(f"{label}: {adv.communication_size / MiB:g} MiB, measured {gap * 100:+.1f}% against the best measured "
              f"({best / MiB:g} MiB); target within 5%: {'met' if gap <= 0.05 else 'NOT met'}")
    slope = (med[sizes[0]] - med[sizes[-1]]) / (advice.curve[0].num_buckets - advice.curve[-1].num_buckets)
    print(f"measured cost per extra bucket (smallest against largest size): {slope * 1e3:.1f} ms; the links' "
          f"latency per bucket: {(advice.curve[0].predicted_sync_s - advice.curve[-1].predicted_sync_s) / (advice.curve[0].num_buckets - advice.curve[-1].num_buckets) * 1e3:.3f} ms")


if __name__ == "__main__":
    main()

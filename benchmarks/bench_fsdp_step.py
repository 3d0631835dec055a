"""FSDP vs DDP step time and optimizer-state bytes on real MLX ring and JAX gloo processes (prints figures).

Targets (issue 30): on CPU ring ranks, strategies interleaved in one run, fp32 AdamW,
communication_size 32 MiB, the ``"auto"`` reduce-scatter, median of at least 3 repeats: FSDP-row and
FSDP-flat at or below 0.90x DDP's step time at 2 ranks (25.2M parameters, the default) and 0.85x at
4 ranks (``--ranks 4 --hidden 1024 --steps 8``); optimizer-state bytes per rank over DDP's = 1/N. The
physical limit is FSDP <= DDP - (1 - 1/N) x DDP's update; ``--phases`` prints it, and each term of
FSDP's step against its share of it.

    python3 benchmarks/bench_fsdp_step.py [--framework both|mlx|jax] [--ranks 2] [--steps 12] [--repeats 3]
        [--phases] [--strategies ddp,fsdp-row,fsdp-flat] [--save runs.json | --load runs.json]

JAX (``workbench.ranks.jax_step_timing``) runs the same model size, one CPU device per process,
gloo collectives, jitted steps; FSDP on resident bucket buffers (``FsdpStep.step_buckets``);
``--strategies`` also takes ``fsdp-row-tree``/``fsdp-flat-tree`` (the pytree step, packing every call)
and ``ddp-donated``. The frameworks alternate within each repeat, and a table of both ratios side by
side ends the output.

Each repeat is a fresh launch. Per repeat, a step's time is the slowest rank's, and a strategy's
figure is the median over steps after two warm-up steps; the table gives the median over
repeats and the spread (lowest-highest) of the repeats. ``--phases`` adds the FSDP step cut into
its parts, each evaluated alone (``workbench.ranks.mlx_step_timing.phased_step``,
``workbench.ranks.jax_phases``), next to DDP.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from workbench.launch.plan import plan_launch
from workbench.launch.local_run import run_worker
from workbench.studies.design_review import step_time_table

WARMUP_STEPS = 2


def steady(ranks: list[dict], series: str, name: str) -> float:
    """Median over steps after warm-up of the slowest rank's seconds."""
    steps = len(ranks[0][series][name])
    return statistics.median(max(r[series][name][i] for r in ranks) for i in range(WARMUP_STEPS, steps))


def spread(values: list[float], scale: float = 1.0, fmt: str = "{:.0f}") -> str:
    return (fmt + " ({}-{})").format(statistics.median(values) * scale, fmt.format(min(values) * scale),
                                     fmt.format(max(values) * scale))


def run_once(args, framework: str, tmp: Path) -> list[dict]:
    common = ["--steps", str(args.steps), "--hidden", str(args.hidden), "--layers", str(args.layers),
              "--strategies", args.strategies, "--communication-size", str(args.communication_size)]
    extra = ["--phases"] if args.phases else []
    if framework == "jax":
        return run_worker(plan_launch(args.ranks, framework="jax"), "workbench.ranks.jax_step_timing", tmp, *common,
                          *extra, timeout_s=1800)
    return run_worker(plan_launch(args.ranks), "workbench.ranks.mlx_step_timing", tmp, *common, *extra, timeout_s=1800)


def ratio_table(framework: str, runs: list[list[dict]], args) -> dict[str, list[float]]:
    """Print one framework's table; returns each strategy's step-time ratios to DDP, one per repeat."""
    r0 = runs[0][0]
    names = list(r0["times_s"])
    med = {name: [steady(ranks, "times_s", name) for ranks in runs] for name in names}
    ratio = {name: [t / d for t, d in zip(med[name], med["ddp"])] for name in names} if "ddp" in med else {}
    transport = (f"reduce-scatter 'auto' = {r0['reduce_scatter_transport']!r}" if framework == "mlx"
                 else f"reduce-scatter 'auto' = all-to-all over {r0['backend']} ('-rs': XLA's psum_scatter), "
                      f"jitted (jax {r0['jax_version']})")
    print(f"\n{framework.upper()} {'ring backend' if framework == 'mlx' else 'on CPU processes'}, {args.ranks} ranks, "
          f"{r0['num_params'] / 1e6:.1f}M parameters (fp32, AdamW), communication_size "
          f"{args.communication_size / 2**20:g} MiB, {transport}, {args.steps} interleaved steps (first "
          f"{WARMUP_STEPS} dropped), {len(runs)} repeat(s): median (lowest-highest) of the repeats")
    print(f"{'strategy':<20}{'step ms':>22}{'/ DDP':>24}{'opt state / DDP':>18}")
    for name in names:
        state = r0["optimizer_state_bytes"][name] / r0["optimizer_state_bytes"].get("ddp", 1)
        rat = spread(ratio[name], fmt="{:.3f}") if ratio else "-"
        print(f"{name:<20}{spread(med[name], 1e3):>22}{rat:>24}{state:>18.3f}")
    return ratio


def print_phases(framework: str, runs: list[list[dict]], args) -> None:
    """Each part's median ms per strategy (DDP's all-reduce in the reduce_scatter row), then the physical
    limit of issue 30, FSDP <= DDP - (1 - 1/N) x DDP's update, and by how much each term of FSDP's step
    exceeds its share of it: collectives (RS + AG - AR), gradient (- DDP's), update (- DDP's / N), packing
    (- DDP's), and what the parts do not hold: the real step (the timed one, not cut) less the sum of its parts,
    over DDP's (DDP's one lazy graph overlaps a bucket's all-reduce with the next bucket's work; a step that
    evaluates bucket by bucket cannot). The terms sum to FSDP's real step minus the limit on DDP's real step."""
    r0 = runs[0][0]
    names = list(r0["phases_s"])
    longest = max((list(r0["phases_s"][name]) for name in names), key=len)  # FSDP's order of parts
    parts = [p for p in dict.fromkeys([*longest, *(p for name in names for p in r0["phases_s"][name])])
             if p != "all_reduce"]
    width = max(14, *(len(name) + 2 for name in names))
    print(f"\n{framework.upper()}: the step part by part (each part evaluated alone; ms, median over repeats; "
          "DDP's all-reduce in the reduce_scatter row):")
    print(f"{'part':<16}" + "".join(f"{name:>{width}}" for name in names))
    ms: dict[str, dict[str, float]] = {name: {} for name in names}
    for part in parts:
        row = []
        for name in names:
            have = r0["phases_s"][name]
            key = "all_reduce" if part == "reduce_scatter" and part not in have else part
            if key not in have:
                row.append(f"{'-':>{width}}")
                continue
            ms[name][part] = 1e3 * statistics.median(statistics.median(max(r["phases_s"][name][key][i] for r in ranks)
                                                                      for i in range(WARMUP_STEPS, args.steps))
                                                    for ranks in runs)
            row.append(f"{ms[name][part]:>{width}.1f}")
        print(f"{part:<16}" + "".join(row))
    print(f"{'sum of parts':<16}" + "".join(f"{sum(ms[name].values()):>{width}.1f}" for name in names))
    timed = {name: name if name in r0["times_s"] else f"fsdp-{name}" for name in names}  # MLX's phases: by layout
    real = {name: 1e3 * statistics.median(steady(ranks, "times_s", timed[name]) for ranks in runs)
            for name in names if timed[name] in r0["times_s"]}
    print(f"{'real step':<16}" + "".join(f"{real[name]:>{width}.1f}" if name in real else f"{'-':>{width}}"
                                         for name in names))
    print(f"{'real - parts':<16}" + "".join(f"{real[name] - sum(ms[name].values()):>{width}.1f}" if name in real
                                            else f"{'-':>{width}}" for name in names))
    ddp = ms.get("ddp", {})
    if "update" not in ddp or "ddp" not in real:
        return
    n, total = args.ranks, sum(ddp.values())
    limit = total - (1 - 1 / n) * ddp["update"]
    real_limit = real["ddp"] - (1 - 1 / n) * ddp["update"]
    grad = next((p for p in ("gradient", "grad") if p in ddp), None)
    fsdp = [name for name in names if not name.startswith("ddp")]

    def packing(m):  # JAX's pack and unpack (the pytree step's parts), MLX's bucket rows and rebuild
        return sum(v for p, v in m.items() if p in ("pack", "unpack", "rows", "rebuild"))

    print(f"limit, DDP - (1 - 1/{n}) x update = {limit:.1f} ms of parts ({limit / total:.3f} x DDP), "
          f"{real_limit:.1f} ms of real step ({real_limit / real['ddp']:.3f} x DDP's); FSDP over the limit, by term (ms):")
    terms = {"collectives": lambda m: m.get("reduce_scatter", 0) + m.get("all_gather", 0) - ddp["reduce_scatter"],
             "gradient": lambda m: m.get(grad, 0) - ddp.get(grad, 0),
             "update": lambda m: m.get("update", 0) - ddp["update"] / n,
             "packing": lambda m: packing(m) - packing(ddp)}
    overlap = {name: (real[name] - sum(ms[name].values())) - (real["ddp"] - total) for name in fsdp if name in real}
    print(f"{'':<16}" + "".join(f"{name:>{width}}" for name in fsdp))
    for term, excess in terms.items():
        print(f"{term:<16}" + "".join(f"{excess(ms[name]):>{width}.1f}" for name in fsdp))
    print(f"{'not in parts':<16}" + "".join(f"{overlap[name]:>{width}.1f}" if name in overlap else f"{'-':>{width}}"
                                            for name in fsdp))
    print(f"{'sum / DDP':<16}" + "".join(f"{sum(ms[name].values()) / total:>{width}.3f}" for name in fsdp))
    print(f"{'real / DDP':<16}" + "".join(f"{real[name] / real['ddp']:>{width}.3f}" if name in real else f"{'-':>{width}}"
                                          for name in fsdp))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--framework", choices=("mlx", "jax", "both"), default="both")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--communication-size", type=int, default=32 * 2**20)
    parser.add_argument("--strategies", default="ddp,fsdp-row,fsdp-flat")
    parser.add_argument("--phases", action="store_true", help="also time each step part by part")
    parser.add_argument("--save", type=Path, help="also write every rank's record of every repeat to this JSON file")
    parser.add_argument("--load", type=Path, help="print the tables of a file --save wrote (with the same "
                                                   "--ranks/--steps/--phases) instead of running")
    args = parser.parse_args()
    if args.load:
        runs = json.loads(args.load.read_text())
        frameworks = list(runs)
    else:
        frameworks = ["mlx", "jax"] if args.framework == "both" else [args.framework]
        runs = {fw: [] for fw in frameworks}
        for rep in range(args.repeats):  # the frameworks alternate too, so load drift hits both alike
            for fw in frameworks:
                with tempfile.TemporaryDirectory() as tmp:
                    runs[fw].append(run_once(args, fw, Path(tmp)))
                print(f"repeat {rep + 1}/{args.repeats} {fw} done", flush=True)
        if args.save:
            args.save.write_text(json.dumps(runs))
    ratios = {fw: ratio_table(fw, runs[fw], args) for fw in frameworks}
    if "mlx" in runs:
        r0 = runs["mlx"][0][0]
        if args.phases and r0["phases_s"]:
            print_phases("mlx", runs["mlx"], args)
        checks = [max(r["rank_check_s"][name] for r in ranks) for ranks in runs["mlx"] for name in ranks[0]["rank_check_s"]]
        if checks:  # issue 14, item 9: the ranks compare their plans once, on a plan's first step
            print(f"MLX ranks' plan check (one all_gather of 19 int32, first step of each plan only): "
                  f"{spread(checks, 1e3, '{:.2f}')} ms over {len(checks)} plans; later steps: 0")
        peak = max(r["peak_memory_bytes"] for ranks in runs["mlx"] for r in ranks)
        print(f"MLX peak memory per rank (every strategy resident at once): {peak / 2**20:.0f} MiB")
    if "jax" in runs and args.phases and runs["jax"][0][0]["phases_s"]:
        print_phases("jax", runs["jax"], args)
    if len(frameworks) == 2 and all(ratios.values()):
        print(f"\nStep time / DDP, {args.ranks} ranks, side by side (median, lowest-highest):")
        print(f"{'strategy':<20}" + "".join(f"{fw:>24}" for fw in frameworks))
        for name in ratios["mlx"]:
            if name != "ddp" and name in ratios["jax"]:
                print(f"{name:<20}" + "".join(f"{spread(ratios[fw][name], fmt='{:.3f}'):>24}" for fw in frameworks))
    print()
    print("MLX PR #3130 (8 B200 GPUs, NCCL), step time in ms:")
    print(step_time_table().to_string())

if __name__ == "__main__":
    main()

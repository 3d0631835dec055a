"""Step time predicted from a model's profile against real runs, and the peak beside it (issue 26; prints a table).

For each framework and rank count it first times the collectives on real engines (the collective benchmark,
:func:`workbench.studies.planner.advise.placement_links`, sizes 4 KiB to 4 MiB, which span these models'
buckets) and fits the alpha-beta links of this placement (loopback), one per rank count; it profiles each model once, on one
process, with the threads a rank gets, as many processes at once as a run has ranks on this host (its
trainer's step timed too: the step's overhead, :attr:`workbench.runs.profile.ModelProfile.step_overhead_s`)
(:func:`workbench.launch.profile.profile_model`); then it runs every
(model, strategy) on real ranks and sets the measured step (slowest rank, median after the first step) beside
:func:`workbench.runs.estimate.predict_run_step_time` term by term
(:func:`workbench.runs.estimate.step_time_validation`: 10% target, the off term named where it misses), and
the measured peak beside the profile's (:func:`workbench.runs.profile_estimate.estimate_with_profile`).

The models: the built-in LM (tiny: collectives and per-step overheads weigh) and
``examples/tiny_attention_lm.py`` (2 blocks, d=96, 4 heads, vocabulary 384, sequence 128: compute weighs).
The machine's load is printed before and after: timings under load are not the model's to hold.

    python3 benchmarks/bench_step_prediction.py [--root DIR] [--frameworks mlx,jax] [--ranks 2,4]
        [--strategies ddp,fsdp-row,fsdp-flat,fsdp-full] [--models lm,attention,mid] [--steps 12] [--global-batch 16]
        [--microbatches 1,2]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import pandas as pd

from workbench.launch.driver import run_training
from workbench.launch.profile import profile_model
from workbench.launch.remote import Placement
from workbench.runs.estimate import spec_from_row, step_time_validation
from workbench.runs.profile_estimate import estimate_with_profile
from workbench.runs.spec import RunSpec
from workbench.runs.tables import load_runs
from workbench.strategies import get_strategy
from workbench.studies.planner.advise import placement_links
from workbench.studies.step_time import fit_links, links_table, load_collective_benchmarks

LINK_SIZES = tuple(2**k for k in range(12, 23, 2))  # 4 KiB to 4 MiB
MODELS = {
    "lm": dict(model=dict(vocab_size=64, seq_len=32, dim=64, num_layers=2, num_heads=4, mlp_dim=128)),
    "attention": dict(model=dict(vocab_size=384, seq_len=128), model_factory="examples.tiny_attention_lm:{fw}_factory"),
    # 33.7M parameters: JAX's buffers are large enough that the rank's high-water mark reads them (a tiny model's
    # reuse pages already resident), so its measured peak is the truth, not XLA's plan (issue 26)
    "mid": dict(model=dict(vocab_size=8192, seq_len=256, dim=512, num_layers=8, num_heads=4, mlp_dim=2048)),
}


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores"


def spec_of(framework: str, model: str, strategy: str, ranks: int, steps: int, global_batch: int,
            num_microbatches: int = 1) -> RunSpec:
    fields = {k: (v.format(fw=framework) if isinstance(v, str) else v) for k, v in MODELS[model].items()}
    # deferred sync where the strategy can defer it (MLX's fully_shard syncs in every micro-batch's backward)
    defers = get_strategy(strategy).implementation(framework).defers_sync
    return RunSpec(framework=framework, strategy=strategy, num_ranks=ranks, steps=steps, global_batch=global_batch,
                   num_microbatches=num_microbatches, defer_sync=defers, **fields)


def _measured_peak(measured: dict) -> int:
    """A rank's measured peak: JAX's truth (the process's high-water mark) where it was read, else ``peak``."""
    return measured.get("truth_peak") or measured.get("peak") or 0


def _model_name(spec: dict) -> str:
    if isinstance(spec.get("model_factory"), str):
        return "attention"
    return next((name for name, kw in MODELS.items() if kw["model"] == spec.get("model")), "lm")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", help="run store (default: a new temporary folder)")
    parser.add_argument("--frameworks", default="mlx,jax")
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--strategies", default="ddp,fsdp-row,fsdp-flat,fsdp-full")
    parser.add_argument("--models", default="lm,attention")
    parser.add_argument("--steps", type=int, default=12)  # a median of 11 steps: the tiny LM's vary 3-18 ms
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--microbatches", default="1", help="G values, comma-separated (deferred sync)")
    args = parser.parse_args()
    root = Path(args.root or tempfile.mkdtemp(prefix="bench-step-prediction-"))
    frameworks, ranks = args.frameworks.split(","), [int(n) for n in args.ranks.split(",")]
    print(f"store {root}; before: {load()}", flush=True)
    t0 = time.monotonic()
    links = {n: {} for n in ranks}  # one link per rank count, never mixed
    mean_links = {n: {} for n in ranks}  # the same benchmark's mean per call: what a miss from stalled calls shows
    for fw in frameworks:
        for n in ranks:  # times that do not grow with size (4 JAX ranks on 2 cores) are measured again, larger
            fitted, source = placement_links(root / "collectives", fw, n, Placement(), sizes_bytes=LINK_SIZES)
            links[n].update(fitted)
            print(f"{fw} {n} ranks: {source}", flush=True)
    table = load_collective_benchmarks(root / "collectives")  # every benchmark is stored by now: read once
    for fw in frameworks:
        for n in ranks:
            try:
                mean_links[n].update(fit_links(table[table.framework == fw], num_ranks=n, statistic="mean"))
            except ValueError as err:  # means that do not grow with size: misses are named without them
                print(f"{fw} {n} ranks: no links fitted to the means ({err})")
    print(f"links fitted ({time.monotonic() - t0:.0f} s); {load()}", flush=True)
    for n in ranks:
        for what, fitted in (("median", links[n]), ("mean", mean_links[n])):
            print(f"{n} ranks, each call's {what}:\n" + links_table(fitted).to_string(index=False, float_format=lambda v: f"{v:.3f}"),
                  flush=True)
    for fw in frameworks:
        for model in args.models.split(","):
            for n in ranks:
                for strategy, g in ((s, int(g)) for s in args.strategies.split(",") for g in args.microbatches.split(",")):
                    spec = spec_of(fw, model, strategy, n, args.steps, args.global_batch, g)
                    profile = profile_model(spec, root)  # cached by the threads a rank of N gets
                    outcome = run_training(spec, root)
                    over = profile.step_overhead_s
                    print(f"{fw} {model} {strategy} N={n} G={g}: {outcome.status} (profile {profile.cost_s:.0f} s when "
                          f"measured, {profile.co_runners} at once, compute {profile.compute_s_at(spec.micro_batch_size) * 1e3:.1f} "
                          f"ms, step overhead {'-' if over is None else f'{over * 1e3:.1f} ms'}); {load()}", flush=True)
    loaded = load_runs(root)
    table = step_time_validation(loaded, lambda s: profile_model(RunSpec(**s), root), lambda s: links[s["num_ranks"]],
                                 mean_links=lambda s: mean_links[s["num_ranks"]] if any(
                                     fw == s["framework"] for fw, _ in mean_links[s["num_ranks"]]) else None)
    peaks = {}
    for _, run in loaded.runs[loaded.runs.status == "done"].iterrows():
        spec = spec_from_row(run)
        measured = max(_measured_peak(r.get("measured_memory") or {}) for r in run["summary.ranks"])
        predicted = estimate_with_profile(spec, profile_model(RunSpec(**spec), root), run.get("model_shapes"))
        peaks[run.run_id] = (predicted.total_bytes / 2**20, measured / 2**20 if measured else float("nan"))
    table["model"] = [_model_name(spec_from_row(r)) for _, r in loaded.runs.set_index("run_id").loc[table.run_id].iterrows()]
    table["peak_predicted_mib"] = [peaks[r][0] for r in table.run_id]
    table["peak_measured_mib"] = [peaks[r][1] for r in table.run_id]
    pd.set_option("display.width", 250)
    cols = ["framework", "model", "strategy", "num_ranks", "num_microbatches", "compute_ms", "update_ms", "comm_ms", "per_bucket_ms",
            "overhead_ms", "predicted_ms", "measured_ms", "measured_sync_ms", "ratio", "comm_mean_ms", "off_term", "peak_predicted_mib",
            "peak_measured_mib"]
    out = table.sort_values(["framework", "model", "num_ranks", "strategy", "num_microbatches"])[cols]
    print(out.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    print(f"within 10%: {int(table.within.sum())} of {len(table)}; after: {load()}; {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()

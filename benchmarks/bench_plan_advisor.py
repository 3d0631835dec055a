"""The plan advisor against real runs (issue 27): for each model and rank count, its pick, predicted against
measured step time and peak of the validated plans (the pick, the runner-up and DDP or the smallest
whole-parameter plan), each measured twice (the noise: how far its two runs' medians lie apart), whether the
measured order of step times agrees with the predicted one, and whether the pick is faster than the runner-up,
within noise of it, or slower.

Each case's budget is chosen so the model must matter: where DDP's smallest plan needs more memory than FSDP's,
the budget lies between them (DDP does not fit, an FSDP plan does); where it does not (activations dominate),
the budget is 1.25 times the largest single-micro-batch plan's peak (everything fits: the pick is the fastest).
The profile, the collective benchmark and the runs are stored under ``--runs`` and reused when run again
(give a new folder to measure afresh). Timings depend on the machine's load: ``uptime`` is printed with the table.

    python3 benchmarks/bench_plan_advisor.py [--ranks 2 4] [--models lm attention mlx-lm] [--steps 8] [--runs DIR]
        [--hosts FILE [--launcher ssh]]

With ``--hosts`` (a hosts file, e.g. the rig's ``rig.json``: ``python3 -m scripts.hosts_rig up``) the ranks are
the file's slots and everything runs there: the collective benchmark across the hosts, and the validated plans.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from pathlib import Path

from workbench.core.units import MiB
from workbench.runs.spec import VALIDATION_MODEL
from workbench.strategies import get_strategy
from workbench.studies.planner import advise_plan, validate_plan
from workbench.studies.planner.tables import order_line, validation_table

#: The models: the built-in LM (its validation size: states dominate), the example factory (activations do), and
#: an mlx-lm Llama built by mlx-lm's own class from a config (tests/data/mlx_lm_tiny.py, no weights).
MODELS = {"lm": dict(model=dict(VALIDATION_MODEL)),
          "attention": dict(model="examples.tiny_attention_lm:mlx_factory", seq_len=128, vocab_size=384),
          "mlx-lm": dict(model="tests.data.mlx_lm_tiny:llama_factory", seq_len=64, vocab_size=256)}


def budget_for(advice) -> tuple[int, str]:
    """The case's budget per rank, bytes, and how it was chosen."""
    def smallest(pred):
        return min((c.predicted_peak_bytes for c in advice.candidates if pred(c)), default=None)

    ddp = smallest(lambda c: get_strategy(c.spec.strategy).family == "data_parallel")
    fsdp = smallest(lambda c: get_strategy(c.spec.strategy).family != "data_parallel")
    if ddp and fsdp and ddp > 1.05 * fsdp:
        return int(1.1 * (ddp + fsdp) / 2), "between FSDP's and DDP's smallest"
    largest = max(c.predicted_peak_bytes for c in advice.candidates if c.spec.num_microbatches == 1)
    return int(1.25 * largest), "roomy (FSDP saves nothing visible)"


def run_case(name: str, ranks: int | None, runs: Path, steps: int, global_batch: int, hosts: Path | None = None,
             launcher: str = "ssh") -> list[str]:
    kw, where = MODELS[name], dict(num_ranks=ranks, hosts=hosts, launcher=launcher)
    roomy = advise_plan(kw["model"], memory_bytes=2**40, global_batch=global_batch, runs_root=runs,
                        seq_len=kw.get("seq_len"), vocab_size=kw.get("vocab_size"), **where)
    budget, how = budget_for(roomy)
    advice = advise_plan(kw["model"], memory_bytes=budget, global_batch=global_batch,
                         runs_root=runs, seq_len=kw.get("seq_len"), vocab_size=kw.get("vocab_size"),
                         profile=roomy.profile, **where)
    ranks = advice.base.num_ranks
    if advice.recommended is None:
        return [f"| {name} | {ranks} | {budget / MiB:.1f} ({how}) | none fits | | | | | |"]
    check = validate_plan(advice, runs, steps=steps, hosts=hosts, launcher=launcher)
    table = validation_table(check).drop(columns="run").reset_index().fillna("-")
    rows = [f"| {name} | {ranks} | {budget / MiB:.1f} ({how}) | {r['role']}: {r['plan']} | "
            f"{r['step ms predicted']} / {r['step ms measured']} ({r['step error']}; noise {r['noise ms']}) | "
            f"{r['peak MiB predicted']} / {r['peak MiB measured']} ({r['peak error']}) | {r['off']} |"
            for r in table.to_dict("records")]
    rows.append(f"| {name} | {ranks} | | {order_line(check)} | | | links: {advice.links_source} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--runs", type=Path, default=Path(tempfile.gettempdir()) / "bench_plan_advisor")
    parser.add_argument("--hosts", type=Path, default=None, help="a hosts file: its slots are the ranks")
    parser.add_argument("--launcher", default="ssh", help="with --hosts: ssh, mpi or slurm")
    args = parser.parse_args()
    if args.hosts is not None:
        args.ranks = [None]
    print(f"load before: {os.getloadavg()[0]:.1f} (1 min)")
    print("| model | N | budget MiB | plan | step ms predicted / measured | peak MiB predicted / measured | off |")
    print("|---|---|---|---|---|---|---|")
    for name in args.models:
        for ranks in args.ranks:
            for row in run_case(name, ranks, args.runs, args.steps, args.global_batch, args.hosts, args.launcher):
                print(row, flush=True)
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()

"""Make the small committed run stores the design-review deck reads (``notebooks/reference_runs/``).

The deck (``notebooks/00_design_review.ipynb``) must build from a clean clone without training
(nbval runs it first, before notebook 04 could have stored anything under the git-ignored
``runs/``), so it reads these: real training runs through :func:`workbench.launch.driver.run_training`
on ipyparallel engines, two ranks each, identical weights and batches, as
:data:`workbench.studies.design_review.REFERENCE_STORES` lists them (``convergence``: DDP, FSDP-row and FSDP-flat
in MLX ring and JAX gloo, ZeRO-3 in JAX, 100 steps; ``memory``: notebook 03's validation runs), and
:data:`~workbench.studies.design_review.REFERENCE_SWEEP` (``comm-size``: the machine's collective
benchmark and a ``communication_size`` sweep, for the bucket-size advice slide).
Each record holds the memory its ranks measured. Regenerate them after a change to the training step:

    python3 scripts/make_reference_runs.py            # about 8 minutes on 2 cores (run it on a quiet machine)
    python3 scripts/make_reference_runs.py memory --framework mlx   # one store's MLX runs only, JAX's kept
    python3 -m workbench refresh notebooks/00_design_review.ipynb

Runs compared side by side (step times above all) should be made together: ``--framework`` redoes every run
of that framework in the named stores and keeps the others' records as they are.

The stores are kept small (about 600 KB together, 400 KB at most each, tested), JSON only.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from workbench.launch.benchmark import run_collective_benchmark
from workbench.launch.driver import run_training
from workbench.ranks.phases import PHASES_FILE
from workbench.runs.lock import LOCK_FILE
from workbench.runs.spec import RunSpec
from workbench.studies.design_review import (
    REFERENCE_STORES,
    REFERENCE_SWEEP,
    reference_runs_dir,
)


def sweep_specs() -> list[RunSpec]:
    """The runs of :data:`REFERENCE_SWEEP`, one per size."""
    return [RunSpec(communication_size=size, **REFERENCE_SWEEP["spec"]) for size in REFERENCE_SWEEP["sizes"]]


def make_sweep(keep: bool) -> list[str]:
    """The collective benchmark, then the sweep; returns what failed."""
    collectives, sweep = reference_runs_dir("collectives"), reference_runs_dir("comm-size")
    for out in (collectives, sweep):
        if out.exists() and not keep:
            shutil.rmtree(out)
    spec = REFERENCE_SWEEP["spec"]
    run_collective_benchmark(collectives, spec["framework"], spec["num_ranks"],
                             sizes_bytes=REFERENCE_SWEEP["collective_sizes"])
    failed = []
    for run in sweep_specs():
        outcome = run_training(run, sweep)
        print(f"comm-size: {run.communication_size} B: {outcome.status}" + (f" ({outcome.error})" if outcome.error else ""),
              flush=True)
        if outcome.status not in ("done", "skipped"):
            failed.append(f"comm-size: {run.communication_size} B")
    drop_scratch(sweep)
    return failed


def drop_scratch(store: Path) -> None:
    """Remove each run's lock and its ranks' start-up phases from ``store``: the deck reads neither."""
    for scratch in [p for name in (LOCK_FILE, PHASES_FILE) for p in store.glob(f"*/{name}")]:
        scratch.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # checked here, not by argparse's choices: with nargs="*" it checks the (list) default as one value and
    # refused the bare command the docstring gives ("invalid choice: ['convergence', 'memory', 'comm-size']")
    known = [*REFERENCE_STORES, "comm-size"]
    parser.add_argument("stores", nargs="*", help=f"store names, of {', '.join(known)} (default: all)")
    parser.add_argument("--keep", action="store_true", help="keep runs already stored (default: start afresh)")
    parser.add_argument("--framework", choices=("mlx", "jax"),
                        help="make only this framework's runs of the stores; the other framework's stay as stored")
    args = parser.parse_args(argv)
    unknown = [name for name in args.stores if name not in known]
    if unknown:
        parser.error(f"unknown store(s) {', '.join(unknown)}; known: {', '.join(known)}")
    args.stores = args.stores or known
    failed = []
    if "comm-size" in args.stores:
        failed += make_sweep(args.keep)
    for name in (s for s in args.stores if s in REFERENCE_STORES):
        pairs, common = REFERENCE_STORES[name]
        pairs = [(f, s) for f, s in pairs if args.framework in (None, f)]
        out = reference_runs_dir(name)
        if out.exists() and not args.keep:
            for old in ([out] if args.framework is None else sorted(out.glob(f"{args.framework}-*"))):
                shutil.rmtree(old)
        for framework, strategy in pairs:
            spec = RunSpec(framework=framework, strategy=strategy, **common)
            t0 = time.perf_counter()
            outcome = run_training(spec, out)
            print(f"{name}: {framework} {strategy}: {outcome.status} in {time.perf_counter() - t0:.1f} s"
                  + (f" ({outcome.error})" if outcome.error else ""), flush=True)
            if outcome.status not in ("done", "skipped"):
                failed.append(f"{name}: {framework} {strategy}")
        drop_scratch(out)
        size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
        print(f"{out}: {size / 1024:.0f} KiB")
    if failed:
        print("failed:", ", ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

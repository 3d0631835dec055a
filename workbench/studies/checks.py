"""What each notebook holds its runs to, as functions of the tables it draws (tested on the committed runs).

A notebook ends by calling its check and showing the dict: every value True, or the claim that failed,
named. The rules live here, not in the notebook's cells: :func:`convergence_checks` (notebook 04),
:func:`comm_size_checks` (05) and :func:`user_model_checks` (07).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

import pandas as pd

from workbench.strategies import COLLECTIVE_KINDS, StepShape, get_strategy

#: FSDP's loss must equal DDP's to this, at every step (fp32; measured differences are ~1e-7).
LOSS_TOLERANCE = 1e-5


def convergence_checks(summary: pd.DataFrame, num_specs: int, floor_nats: float, vocab_size: int) -> dict[str, bool]:
    """Notebook 04: every run done; FSDP's losses within :data:`LOSS_TOLERANCE` of DDP's at every step; no final
    loss below the data's entropy floor; every final loss below uniform guessing (``log vocab_size``).

    Args:
        summary: :func:`workbench.studies.runs.summarize_runs` of the runs.
        num_specs: How many runs the sweep asked for.
    """
    return {
        "every run stored and done": bool((summary.status == "done").all()) and len(summary) == num_specs,
        "FSDP (row, flat, full) within 1e-5 of DDP at every step":
            bool((summary.max_abs_loss_diff_to_ddp < LOSS_TOLERANCE).all()),
        "no final loss below the entropy floor": bool((summary.final_loss > floor_nats).all()),
        "training lowered the loss": bool((summary.final_loss < math.log(vocab_size)).all()),
    }


def collectives_per_bucket(strategy: str) -> int:
    """Collectives a strategy's step issues per bucket of one sync (its record: DDP 1, FSDP's step 2)."""
    return sum(get_strategy(strategy).collective_counts(StepShape(num_ranks=2, sync_bytes=(1.0,))).values())


def comm_size_checks(table: pd.DataFrame, *, all_runs_done: bool, num_specs: int, links: Mapping[Any, Any],
                     frameworks: Iterable[str], advised_size: int, sizes: Iterable[int],
                     peak_tolerance: float) -> dict[str, bool]:
    """Notebook 05: every run done; a positive bandwidth fitted for every collective of each framework; fewer
    buckets as ``communication_size`` grows (each strategy and precision); each run's collectives = buckets x
    the record's per bucket; the advice one of the sizes swept; every peak within ``peak_tolerance`` of the model.

    Args:
        table: :func:`workbench.studies.step_time.comm_size_table` of the sweep.
        links: :func:`workbench.studies.step_time.fit_links` (one per framework and collective).
        frameworks: The frameworks benchmarked.
    """
    wanted = [(f, kind) for f in frameworks for kind in COLLECTIVE_KINDS]
    per_bucket = table.strategy.map(collectives_per_bucket)
    return {
        "every run stored and done": bool(all_runs_done) and len(table) == num_specs,
        "every collective and framework fitted with a positive bandwidth":
            all(key in links and links[key].beta_bytes_per_s > 0 for key in wanted),
        "fewer buckets as communication_size grows": all(
            g.sort_values("communication_size").num_buckets.is_monotonic_decreasing
            for _, g in table.groupby(["framework", "strategy", "precision"])),
        "FSDP makes two collectives per bucket, DDP one": bool((table.num_collectives == table.num_buckets * per_bucket).all()),
        "the advice is one of the sizes swept": advised_size in set(sizes),
        "peak memory within 10% of the model on every run": bool(
            ((table.peak_mib / table.predicted_peak_mib - 1).abs() <= peak_tolerance).all()),
    }


def user_model_checks(summary: pd.DataFrame, num_specs: int, validation: pd.DataFrame, vocab_size: int,
                      peaks: pd.DataFrame | None = None) -> dict[str, bool]:
    """Notebook 07: every run done; FSDP's losses within :data:`LOSS_TOLERANCE` of DDP's (runs with a DDP twin);
    parameters and optimizer state within the validation's tolerance; every final loss below uniform guessing;
    and, given ``peaks``, every run's measured peak within its tolerance of the prediction made from the model's
    profile (runs whose stored peak is not a measurement are shown there with their cause, not held; at least
    one run must be held).

    Args:
        validation: :func:`workbench.studies.memory.memory_validation` of the runs.
        peaks: :func:`workbench.studies.your_model.peak_table` of the runs.
    """
    checks = {
        "every run stored and done": bool((summary.status == "done").all()) and len(summary) == num_specs,
        "FSDP within 1e-5 of DDP at every step": bool((summary.max_abs_loss_diff_to_ddp.dropna() < LOSS_TOLERANCE).all()),
        "parameters and optimizer state within 5% of the estimate":
            bool(validation[validation.component != "peak"].within.all()),
        "training lowered the loss below uniform guessing": bool((summary.final_loss < math.log(vocab_size)).all()),
    }
    if peaks is not None:
        held = peaks.within.dropna()
        checks["every measured peak within 10% of its profile's prediction"] = bool(len(held)) and bool(held.all())
    return checks

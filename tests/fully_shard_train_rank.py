"""One rank of a stored run, as an engine runs it (:func:`workbench.ranks.entry.train_rank`), started by a launch
plan instead of engines: tests/test_fully_shard_runs.py runs ``mlx-fully-shard`` on MLX's MPI backend this way
(``run_training``'s engines join a ring).

    python tests/fully_shard_train_rank.py --runs ROOT --run-id ID --out DIR

The run's record must exist (``RunStore.create``); each rank appends its steps to it, as under
``run_training``, and writes its report to ``DIR/rank{r}.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from workbench.ranks.entry import train_rank
from workbench.runs.store import RunStore


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=Path, required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    spec = RunStore(args.runs).load_record(args.run_id)["spec"]
    report = train_rank(spec, str(args.runs), args.run_id)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{report['rank']}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()

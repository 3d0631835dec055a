"""Does a dying engine's error say why, every time, on a loaded machine? (issue 24, item 11; prints, asserts nothing)

Runs the death case ``--runs`` times beside ``--burners`` busy processes: two engines, and rank 1
prints a line to Python's stderr, writes one natively to fd 2, then ends by ``os._exit(3)`` or SIGSEGV
(alternating). Counts the runs whose error names rank 1, how it ended, and both lines.

    python3 benchmarks/bench_engine_death.py [--runs 10] [--burners 4]

Measured on the 2-core machine beside 4 burners (load 6-10): 20/20 and 12/12 runs had all five parts.
The code at 9cb1f8b (before this fix), 10 runs: rank 10/10, native line 10/10, cause 0/10, Python's line 0/10,
and every error said "Engine N died".
"""

from __future__ import annotations

import argparse
import multiprocessing
import re
import time

from workbench.launch.engines import EngineFailure, start_engines
from workbench.launch.plan import plan_launch


def burn() -> None:
    while True:
        pass


def die_as_rank_one(rank: int, how: str) -> None:
    import os
    import signal
    import sys
    import time
    if rank != 1:
        time.sleep(120)
        return
    print(f"python words before {how}", file=sys.stderr)
    os.write(2, f"native words before {how}\n".encode())
    if how == "exit":
        os._exit(3)
    os.kill(os.getpid(), signal.SIGSEGV)


def one_death(how: str) -> tuple[dict[str, bool], float, str]:
    """(which parts the error has, seconds from the call to the error, the error)."""
    run = start_engines(plan_launch(2, framework="mlx"))
    t0 = time.monotonic()
    try:
        run.apply(die_as_rank_one, [(0, how), (1, how)], timeout_s=120)
        message = "no failure"
    except EngineFailure as err:
        message = str(err)
    cause = "exit code 3" if how == "exit" else "SIGSEGV"
    parts = {"rank 1 named": message.startswith("rank 1 failed"),
             "no ipyparallel engine id": not re.search(r"Engine \d+ died", message), "cause named": cause in message,
             "python line": f"python words before {how}" in message,
             "native line": f"native words before {how}" in message}
    return parts, time.monotonic() - t0, message


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--burners", type=int, default=4)
    args = parser.parse_args()
    burners = [multiprocessing.Process(target=burn, daemon=True) for _ in range(args.burners)]
    for b in burners:
        b.start()
    counts: dict[str, int] = {}
    seconds = []
    try:
        for i in range(args.runs):
            how = ("exit", "segv")[i % 2]
            parts, s, message = one_death(how)
            seconds.append(s)
            for k, ok in parts.items():
                counts[k] = counts.get(k, 0) + ok
            if not all(parts.values()):
                print(f"run {i} ({how}) lacks {[k for k, ok in parts.items() if not ok]}:\n{message[:1500]}\n")
    finally:
        for b in burners:
            b.terminate()
    print(f"{args.runs} deaths beside {args.burners} burners, error after {min(seconds):.1f}-{max(seconds):.1f} s:")
    for k, n in counts.items():
        print(f"  {k}: {n}/{args.runs}")


if __name__ == "__main__":
    main()

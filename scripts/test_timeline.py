"""Which pytest-xdist worker ran which test file when, from the file ``$WORKBENCH_TEST_TIMELINE`` names.

    WORKBENCH_TEST_TIMELINE=/tmp/timeline.txt bash scripts/test.sh
    python3 scripts/test_timeline.py /tmp/timeline.txt [--files 12]

Prints each worker's busy seconds and its last files, how long the run's end had fewer workers busy than it
started with (seconds in which a core may idle while one worker finishes a long file alone), and the files that
took the most CPU: on 2 cores the suite is CPU-bound, so CPU, not wall time under load, is what a cut saves. Each
line of the file (tests/conftest.py writes them) is ``worker file first-start last-end cpu-seconds``: the worker's
CPU and that of the processes it waited for (ranks, engines, kernels, Chromium) while the file's tests ran.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path


def read(path: Path) -> dict[str, list[tuple[float, float, str, float]]]:
    """``{worker: [(start, end, file, cpu), ...]}`` in start order."""
    spans = defaultdict(list)
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        parts = line.split()
        try:
            spans[parts[0]].append((float(parts[2]), float(parts[3]), parts[1], float(parts[4])))
        except (IndexError, ValueError):
            raise SystemExit(f"{path}:{number}: expected 'worker file start end cpu', got {line!r}") from None
    return {w: sorted(s) for w, s in sorted(spans.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("timeline", type=Path)
    parser.add_argument("--files", type=int, default=5, help="last files shown per worker")
    parser.add_argument("--cpu", type=int, default=15, help="files shown, most CPU first")
    args = parser.parse_args()
    spans = read(args.timeline)
    if not spans:
        raise SystemExit(f"{args.timeline}: empty")
    t0 = min(s[0][0] for s in spans.values())
    ends = {w: max(e for _, e, _, _ in s) - t0 for w, s in spans.items()}
    for worker, files in spans.items():
        busy = sum(e - s for s, e, _, _ in files)
        last = ", ".join(f"{name} {s - t0:.0f}-{e - t0:.0f}" for s, e, name, _ in files[-args.files:])
        print(f"{worker}: {len(files)} files, busy {busy:.0f} s, done at {ends[worker]:.0f} s; last: {last}")
    done = sorted(ends.values())
    print(f"all done at {done[-1]:.0f} s; the last {done[-1] - done[0]:.0f} s had fewer than {len(done)} workers busy "
          f"(first worker done at {done[0]:.0f} s)")
    files = sorted((span for s in spans.values() for span in s), key=lambda span: -span[3])
    total = sum(span[3] for span in files)
    print(f"CPU: {total:.0f} s over {len(files)} files; the most:")
    for start, end, name, cpu in files[:args.cpu]:
        print(f"  {cpu:7.1f} s CPU  {end - start:7.1f} s wall  {name}")


if __name__ == "__main__":
    main()

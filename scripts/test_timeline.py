"""Which pytest-xdist worker ran which test file when, from the file ``$WORKBENCH_TEST_TIMELINE`` names.

    WORKBENCH_TEST_TIMELINE=/tmp/timeline.txt bash scripts/test.sh
    python3 scripts/test_timeline.py /tmp/timeline.txt [--files 12]

Prints each worker's busy seconds and its last files, and how long the run's end had fewer workers busy than it
started with: seconds in which a core may idle while one worker finishes a long file alone. Each line of the file
(tests/conftest.py writes them) is ``worker file first-start last-end``.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path


def read(path: Path) -> dict[str, list[tuple[float, float, str]]]:
    """``{worker: [(start, end, file), ...]}`` in start order."""
    spans = defaultdict(list)
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        parts = line.split()
        if len(parts) != 4:
            raise SystemExit(f"{path}:{number}: expected 'worker file start end', got {line!r}")
        spans[parts[0]].append((float(parts[2]), float(parts[3]), parts[1]))
    return {w: sorted(s) for w, s in sorted(spans.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("timeline", type=Path)
    parser.add_argument("--files", type=int, default=5, help="last files shown per worker")
    args = parser.parse_args()
    spans = read(args.timeline)
    if not spans:
        raise SystemExit(f"{args.timeline}: empty")
    t0 = min(s[0][0] for s in spans.values())
    ends = {w: max(e for _, e, _ in s) - t0 for w, s in spans.items()}
    for worker, files in spans.items():
        busy = sum(e - s for s, e, _ in files)
        last = ", ".join(f"{name} {s - t0:.0f}-{e - t0:.0f}" for s, e, name in files[-args.files:])
        print(f"{worker}: {len(files)} files, busy {busy:.0f} s, done at {ends[worker]:.0f} s; last: {last}")
    done = sorted(ends.values())
    print(f"all done at {done[-1]:.0f} s; the last {done[-1] - done[0]:.0f} s had fewer than {len(done)} workers busy "
          f"(first worker done at {done[0]:.0f} s)")


if __name__ == "__main__":
    main()

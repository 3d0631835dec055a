"""How long an explorer takes to settle after a model change, kernel side: prints figures, asserts nothing.

Issue 29 item 4's target: a model change settled within 500 ms on a quiet machine. Settled here means
``update()`` has returned: plans, figures and HTML computed and every widget message sent (the browser's
redraw comes on top; tests/test_browser.py times the round trip). Each preset is picked once from the
previous one (a first visit: nothing memoised, the preset's spec built once per process, as in a
notebook), then all of them again (memoised plans and figures). Also the bytes of widget messages each
change sends, which the browser must parse and draw. Prints the machine's load average beside the figures.

    python3 benchmarks/bench_explorer_model_change.py
"""

from __future__ import annotations

import os
import statistics
import time

import ipywidgets

from workbench.core.presets import list_presets
from workbench.core.units import MiB, format_bytes

SENT = [0]
_send = ipywidgets.Widget._send


def _counting_send(self, msg, buffers=None):
    """Count the bytes of each widget message (state JSON and binary buffers); there is no kernel to send to."""
    import json

    SENT[0] += len(json.dumps(msg, default=str)) + sum(len(memoryview(b).cast("B")) for b in buffers or ())
    return _send(self, msg, buffers)


def change_models(explorer, models) -> list[tuple[str, float, int]]:
    """(model, milliseconds of the change, bytes sent) for each model in turn."""
    rows = []
    for model in models:
        SENT[0] = 0
        t0 = time.perf_counter()
        explorer.controls["model"].value = model
        rows.append((model, (time.perf_counter() - t0) * 1e3, SENT[0]))
    return rows


def report(name: str, rows) -> None:
    for model, ms, sent in rows:
        print(f"  {name:<8} {model:<16} {ms:>8.1f} ms  {format_bytes(sent):>11} sent")
    times = [ms for _, ms, _ in rows]
    print(f"  {name:<8} {'median / max':<16} {statistics.median(times):>8.1f} / {max(times):.1f} ms")


def main() -> None:
    from workbench.views.memory_explorer import build_memory_explorer
    from workbench.views.widgets import build_layout_explorer

    ipywidgets.Widget._send = _counting_send
    models = [m for m in list_presets() if m != "llama-3-8b"] + ["llama-3-8b"]
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    for name, build in (("layout", lambda: build_layout_explorer("llama-3-8b", communication_size=32 * MiB,
                                                                  num_shards=8)),
                        ("memory", lambda: build_memory_explorer("llama-3-8b", num_shards=(8, 512)))):
        explorer = build()
        explorer.probe.width = 960  # as a browser at 1400 px reports it
        print(f"{name} explorer, first visit of each preset (model change -> update() returned):")
        report(name, change_models(explorer, models))
        print(f"{name} explorer, second visit (memoised where the explorer keeps plans and figures):")
        report(name, change_models(explorer, models))
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()

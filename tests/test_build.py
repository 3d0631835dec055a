"""The main job as a newcomer meets it: progress while it works, one line when it fails, and a build
that, interrupted and started again, continues from the runs already stored.

Each test runs ``python -m workbench build`` in a subprocess on small notebooks written here, with
real kernels and, where a run is involved, real engines.
"""

import json
import os
import signal
import subprocess
import sys
import time

import nbformat
import pytest

from workbench.core.events import format_duration
from workbench.publish.buildlog import ProgressPrinter

TINY = dict(vocab_size=32, seq_len=8, dim=16, num_layers=1, num_heads=2, mlp_dim=32)


def notebook(path, *sources):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def sweep_notebook(path, steps, **run_kwargs):
    return notebook(
        path,
        "from workbench.publish.notebook import runs_dir, setup\nsettings = setup()",
        "from workbench.views.progress import run_sweep\nfrom workbench.launch.driver import RunSpec\n"
        f"specs = [RunSpec(framework='mlx', strategy=s, num_ranks=2, steps={steps}, global_batch=4, model={TINY!r}) "
        "for s in ('ddp', 'fsdp-flat')]",
        f"outcomes = run_sweep(specs, runs_dir('build-test'), **{run_kwargs!r})",
        "print([o.status for o in outcomes])",
    )


def build(tmp_path, *notebooks, wait=True):
    env = {**os.environ, "WORKBENCH_RUNS": str(tmp_path / "runs"), "PYTHONUNBUFFERED": "1"}
    # A relative --out, as a user types it (the kernel itself runs in the notebook's folder).
    argv = [sys.executable, "-m", "workbench", "build", "--out", "build", *map(str, notebooks)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    if not wait:
        return proc
    out, err = proc.communicate(timeout=600)
    return proc.returncode, out, err


def test_a_failing_cell_is_one_line_naming_notebook_and_cell(tmp_path):
    nb = notebook(tmp_path / "01_fails.ipynb", "x = 1", "# a comment first\nraise ValueError('bucket 7 is too big')", "y = 2")
    code, out, err = build(tmp_path, nb)
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1, err  # one line, no page of traceback
    assert "01_fails.ipynb, cell 2 (`raise ValueError('bucket 7 is too big')`): ValueError: bucket 7 is too big" in lines[0]
    log = tmp_path / "build" / "logs" / "01_fails.log"
    assert "ValueError" in log.read_text()
    assert "(traceback: build/logs/01_fails.log)" in lines[0]
    assert "[1/1] 01_fails.ipynb: executing (3 cells)" in out


def test_a_missing_notebook_is_named_before_anything_runs(tmp_path):
    code, out, err = build(tmp_path, tmp_path / "nope.ipynb")
    assert code == 2 and err.strip() == (f"workbench build: no such notebook: {tmp_path / 'nope.ipynb'} "
                                         "(give the path of an existing .ipynb)")


def test_progress_names_each_run_and_a_second_build_skips_what_is_stored(tmp_path):
    nb = sweep_notebook(tmp_path / "02_sweep.ipynb", steps=4)
    code, out, err = build(tmp_path, nb)
    assert code == 0, err
    assert "[1/1] 02_sweep.ipynb: executing (4 cells)" in out
    assert "run 1/2 mlx ddp: started, 4 steps" in out
    assert "run 2/2 mlx fsdp-flat: done in" in out
    assert "workbench build: done in" in out
    html = (tmp_path / "build" / "html" / "02_sweep.html").read_text()
    assert "[&#x27;done&#x27;, &#x27;done&#x27;]" in html or "['done', 'done']" in html

    code, out, err = build(tmp_path, nb)  # resumed: nothing to train
    assert code == 0, err
    assert out.count("already stored: skipped") == 2 and "started" not in out


def test_a_failed_run_fails_the_build_naming_the_run(tmp_path):
    # 1000 steps cannot finish before the run's first check of its 0.01 s limit (0.1 s in).
    nb = sweep_notebook(tmp_path / "03_fail.ipynb", steps=1000, timeout_s=0.01)
    code, out, err = build(tmp_path, nb)
    assert code == 1
    (line,) = err.strip().splitlines()
    assert line.startswith("workbench build failed: ") and "03_fail.ipynb: run " in line
    assert "(mlx ddp) failed: ranks [0, 1] did not finish within 0.01 s" in line, line
    assert "and 1 more failed runs" in line


def test_interrupted_build_continues_where_it_stopped(tmp_path):
    # 200 steps: the second run, on the engines the first one leaves (a sweep's pool), takes seconds, not one
    nb = sweep_notebook(tmp_path / "04_long.ipynb", steps=200)
    proc = build(tmp_path, nb, wait=False)
    seen = ""
    deadline = time.monotonic() + 300
    while "run 2/2" not in seen:  # the first run is stored, the second started
        line = proc.stdout.readline()
        assert line and time.monotonic() < deadline, seen
        seen += line
    steps = tmp_path / "runs" / "build-test"
    while not any(p.stat().st_size for p in steps.glob("mlx-fsdp_flat-*/steps.jsonl")):  # and under way
        assert proc.poll() is None and time.monotonic() < deadline, seen
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (seen + out, err)
    assert "interrupted in" in err and "04_long.ipynb, cell 3 (`outcomes = run_sweep(" in err
    assert "run the same command to continue" in err
    records = [json.loads(p.read_text()) for p in (tmp_path / "runs" / "build-test").glob("*/record.json")]
    assert sorted(r["status"] for r in records) == ["done", "failed"]  # the interrupted run is recorded

    code, out, err = build(tmp_path, nb)  # again: the stored run is skipped, the interrupted one redone
    assert code == 0, err
    assert "run 1/2 mlx ddp: already stored: skipped" in out
    assert "run 2/2 mlx fsdp-flat: done in" in out


def test_progress_printer_lines_and_status(tmp_path):
    from io import StringIO

    stream = StringIO()
    printer = ProgressPrinter(tmp_path / "p.jsonl", stream=stream, tty=False)
    printer.notebook_start("05_x.ipynb", 5, 7, 19)
    events = [
        {"event": "run_start", "index": 3, "runs": 14, "label": "mlx fsdp-row", "steps": 12, "run_id": "r3"},
        {"event": "run_steps", "index": 3, "runs": 14, "done": 6, "steps": 12, "eta_run_s": 30.0, "eta_sweep_s": 400.0},
        {"event": "run_end", "index": 3, "runs": 14, "label": "mlx fsdp-row", "status": "failed", "seconds": 61.0,
         "error": "rank 1 died", "run_id": "r3"},
    ]
    with open(tmp_path / "p.jsonl", "a") as f:
        f.write("".join(json.dumps(e) + "\n" for e in events) + '{"event": "run_st')  # a line half written
    printer.poll()
    text = stream.getvalue()
    assert "[5/7] 05_x.ipynb: executing (19 cells)" in text
    assert "run 3/14 mlx fsdp-row: started, 12 steps" in text
    assert "run 3/14 mlx fsdp-row: step 6/12, run ends in ~30 s, sweep in ~6 min 40 s" in text
    assert "run 3/14 mlx fsdp-row: FAILED: rank 1 died" in text
    assert [e["run_id"] for e in printer.failed_runs] == ["r3"]
    printer.close()
    assert format_duration(3725) == "1 h 02 min" and format_duration(None) == "?"


@pytest.mark.parametrize("done, expected", [(1, (None, None)), (3, "pace")])
def test_sweep_clock_estimates_from_the_pace_of_steps(done, expected):
    from workbench.launch.sweep import SweepClock

    clock = SweepClock(num_runs=4)
    clock.run_started()
    clock.eta(1, 10)  # the first step fixes the start of the pace
    time.sleep(0.2)
    run_left, sweep_left = clock.eta(done, 10)
    if expected == "pace":
        pace = 0.2 / 2
        assert run_left == pytest.approx(pace * 7, rel=0.5)
        assert sweep_left > run_left + 3 * run_left  # three runs still to come, each longer than what is left
    else:
        assert (run_left, sweep_left) == expected


def test_a_terminal_gets_one_status_line_with_a_bar(tmp_path):
    from io import StringIO

    stream = StringIO()
    printer = ProgressPrinter(tmp_path / "p.jsonl", stream=stream, tty=True)
    printer.notebook_start("04_convergence.ipynb", 5, 7, 19)
    printer.cell_start(7)
    with open(tmp_path / "p.jsonl", "a") as f:
        f.write(json.dumps({"event": "run_start", "index": 2, "runs": 8, "label": "jax ddp", "steps": 200, "run_id": "r"}) + "\n")
        f.write(json.dumps({"event": "run_steps", "index": 2, "runs": 8, "done": 100, "steps": 200, "eta_run_s": 12,
                            "eta_sweep_s": 95}) + "\n")
    printer.poll()
    printer._redraw()
    last = stream.getvalue().split("\r\033[K")[-1]
    assert last == ("[5/7] 04_convergence.ipynb | cell 8/19 | run 2/8 jax ddp | [##########..........] "
                    "step 100/200, run ends in ~12 s, sweep in ~1 min 35 s")
    assert "step 100/200" not in stream.getvalue().split("\n")[-2]  # steps redraw the status line, no new line
    printer.close()
    assert stream.getvalue().endswith("\r\033[K")  # the status line is cleared at the end


def test_all_done_means_every_run_stored_and_done():
    from workbench.launch.driver import RunOutcome
    from workbench.launch.sweep import all_done

    assert all_done([RunOutcome("a", "done"), RunOutcome("b", "skipped")])
    assert not all_done([RunOutcome("a", "done"), RunOutcome("b", "failed", "rank 1 died", 1)])
    assert not all_done([])  # a sweep that ran nothing proves nothing


def test_refresh_of_a_failing_notebook_is_one_line_and_leaves_the_file(tmp_path):
    nb = notebook(tmp_path / "07_fails.ipynb", "raise RuntimeError('no engines here')")
    before = nb.read_bytes()
    proc = subprocess.run([sys.executable, "-m", "workbench", "refresh", str(nb)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("workbench refresh failed: ") and "07_fails.ipynb, cell 1" in line
    assert "RuntimeError: no engines here" in line
    assert nb.read_bytes() == before


def test_slides_of_a_failing_notebook_is_one_line(tmp_path):
    nb = notebook(tmp_path / "08_fails.ipynb", "x = 1", "1 / 0")
    proc = subprocess.run([sys.executable, "-m", "workbench", "slides", str(nb), "--out", str(tmp_path / "deck")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("workbench slides failed: ") and "08_fails.ipynb, cell 2 (`1 / 0`): ZeroDivisionError" in line

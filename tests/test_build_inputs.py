"""What keeps builds apart and their outputs whole (issue 24, items 16-18): one build per ``--out``
(a second is refused, naming the first), no two notebooks of one name in a build, and every output
written atomically, so a full disk names the file and leaves the earlier one as it was.

The full-disk tests fill a real 1 MiB tmpfs (mounted here; they skip, saying why, where mounting is
not permitted). Builds run as ``python -m workbench build`` in subprocesses with real kernels.
"""

import errno
import os
import queue
import socket
import subprocess
import sys
import threading
import time

import nbformat
import pytest

from workbench.__main__ import main
from workbench.publish.buildlog import OUT_LOCK, OutInUse, lock_out
from workbench.publish.nbtools import export_html
from workbench.runs.atomic import WriteError, write_atomic

KiB = 1024


def notebook(path, *sources):
    path.parent.mkdir(parents=True, exist_ok=True)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def build(cwd, *args, wait=True):
    env = {**os.environ, "WORKBENCH_RUNS": str(cwd / "runs"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "workbench", "build", *map(str, args)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if not wait:
        return proc
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


def lines_of(stream):
    """A queue that gets each line of ``stream`` as it comes (None at its end): reads never block a test."""
    lines = queue.Queue()

    def pump():
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def wait_for(lines, text, timeout_s=240):
    seen, deadline = "", time.monotonic() + timeout_s
    while text not in seen:
        line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        assert line is not None, f"ended before {text!r}: {seen}"
        seen += line
    return seen


# --------------------------------------------------------------------------- item 16: one build per --out


def test_a_second_build_on_the_same_out_is_refused_naming_the_first(tmp_path):
    """Two real builds on one --out: the second stops at once, naming the first (pid, start, command),
    and touches nothing of it; the first ends as its own notebook decides."""
    waiting = notebook(tmp_path / "a" / "waits.ipynb",
                       "import pathlib, time\nt0 = time.monotonic()\n"
                       "while not pathlib.Path('go').exists() and time.monotonic() - t0 < 240:\n    time.sleep(0.1)")
    failing = notebook(tmp_path / "b" / "fails.ipynb", "raise ValueError('the other build failed')")
    first = build(tmp_path, "--out", "build", "a/waits.ipynb", wait=False)
    try:
        lines = lines_of(first.stdout)
        seen = wait_for(lines, "waits.ipynb: executing")
        code, out, err = build(tmp_path, "--out", "build", failing.relative_to(tmp_path))
        assert code == 2, (out, err)
        (line,) = err.strip().splitlines()
        assert line.startswith(f"workbench build: --out build is in use by another build (process {first.pid} on "
                               f"{socket.gethostname()}, started 20"), line
        assert line.endswith("running `python -m workbench build --out build a/waits.ipynb`); wait for it to end or "
                             "stop it, or give this build another --out"), line
        assert not (tmp_path / "build" / "logs" / "fails.log").exists()  # the refused build ran nothing
        assert not (tmp_path / "build" / "logs" / "fails.kernel.log").exists()
        (waiting.parent / "go").touch()
        seen += wait_for(lines, "workbench build: done in")
        assert first.wait(timeout=60) == 0, (seen, first.stderr.read())
    finally:
        first.kill()
        first.wait(timeout=60)
    assert (tmp_path / "build" / "html" / "waits.html").is_file()


def test_the_out_lock_is_let_go_when_its_holder_is_killed(tmp_path):
    """Held by a live process, the lock names it; SIGKILLed, it holds nothing (the kernel drops its flock)."""
    out = tmp_path / "out"
    code = ("import sys, time\nfrom workbench.publish.buildlog import lock_out\n"
            "with lock_out(sys.argv[1], 'python -m workbench build --out out'):\n"
            "    print('held', flush=True)\n    time.sleep(120)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(OutInUse, match=rf"in use by another build \(process {holder.pid} on .*running "
                                           r"`python -m workbench build --out out`\)"):
            with lock_out(out, "python -m workbench build --out out"):
                pass
    finally:
        holder.kill()
        holder.wait(timeout=60)
    with lock_out(out, "mine") as path:  # a dead holder blocks nothing
        assert path == out / OUT_LOCK and f'"pid": {os.getpid()}' in path.read_text()
    with lock_out(out, "mine again"):  # and the with block let go of it
        pass


# --------------------------------------------------------------------------- item 17: names that clash


@pytest.mark.parametrize("command, extra, written", [("build", [], "html/report.html"),
                                                      ("slides", ["--no-execute"], "report.slides.html")])
def test_two_notebooks_of_the_same_name_are_refused_naming_both(tmp_path, capsys, command, extra, written):
    a = notebook(tmp_path / "a" / "report.ipynb", "print('a')")
    b = notebook(tmp_path / "b" / "report.ipynb", "print('b')")
    out = tmp_path / "out"
    assert main([command, "--out", str(out), *extra, str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert err == (f"workbench {command}: {a} and {b} would both write {out / written} (and the same logs); "
                   f"rename one, or give each its own --out\n")
    assert not out.exists()  # refused before anything was written

    assert main([command, "--out", str(out), *extra, str(a), str(a)]) == 2
    assert capsys.readouterr().err == f"workbench {command}: {a} is named twice; name each notebook once\n"


# --------------------------------------------------------------------------- item 18: a full disk


@pytest.fixture
def small_disk(tmp_path):
    """A real 1 MiB tmpfs, unmounted afterwards."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True,
                          text=True, timeout=60)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill here: {done.stderr.strip() or done.returncode}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True, timeout=60)


def fill(disk, leave_bytes):
    """Fill ``disk`` until about ``leave_bytes`` are free."""
    stat = os.statvfs(disk)
    with open(disk / "filler", "wb") as f:
        f.write(b"\0" * max(0, stat.f_bavail * stat.f_frsize - leave_bytes))
    stat = os.statvfs(disk)
    assert stat.f_bavail * stat.f_frsize <= leave_bytes + 8 * KiB


def test_a_full_disk_keeps_the_earlier_html_and_names_the_file(small_disk):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# the earlier build")])
    html = small_disk / "html" / "report.html"
    html.parent.mkdir()
    assert export_html(nb, html) > 200 * KiB  # the earlier, good output
    earlier = html.read_bytes()
    fill(small_disk, leave_bytes=128 * KiB)
    nb.cells.append(nbformat.v4.new_markdown_cell("a newer, longer build " * 20_000))  # more than truncating frees
    with pytest.raises(WriteError) as raised:
        export_html(nb, html)
    assert raised.value.errno == errno.ENOSPC
    assert str(raised.value) == f"could not write {html}: No space left on device (the earlier file there is kept)"
    assert html.read_bytes() == earlier
    assert [p.name for p in html.parent.iterdir()] == ["report.html"]  # no temporary file left behind

    with pytest.raises(WriteError, match=r"could not write .*new\.html: No space left on device \(nothing was left"):
        write_atomic(html.parent / "new.html", b"x" * 256 * KiB)
    assert [p.name for p in html.parent.iterdir()] == ["report.html"]


def test_a_build_on_a_full_disk_fails_naming_the_file_and_keeps_the_earlier_one(tmp_path, small_disk):
    notebook(tmp_path / "report.ipynb", "print('a newer build')")
    html = small_disk / "build" / "html" / "report.html"
    html.parent.mkdir(parents=True)
    html.write_text("<html>the earlier build</html>")
    fill(small_disk, leave_bytes=128 * KiB)  # room for the logs, not for the HTML (270 KiB)
    code, out, err = build(tmp_path, "--out", small_disk / "build", "report.ipynb")
    assert code == 1, (out, err)
    (line,) = err.strip().splitlines()
    assert line == (f"workbench build failed: report.ipynb: could not write {html}: No space left on device "
                    "(the earlier file there is kept)")
    assert html.read_text() == "<html>the earlier build</html>"
    assert [p.name for p in html.parent.iterdir()] == ["report.html"]

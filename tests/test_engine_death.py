"""An engine that dies from a signal or ``os._exit``: the run's error names the rank, how it ended, and its
last words (issue 24, item 11). Real engines that really die; the reading of a log is tested in one process."""

import os
import re
import time

import pytest

from workbench.launch.engines import EngineFailure, start_engines
from workbench.launch.outstream import describe_exit, exit_status, is_local_engine, last_words
from workbench.launch.plan import plan_launch as _plan_launch

HERE = os.path.dirname(os.path.abspath(__file__))


def plan_launch(n, **kw):
    """Engines import this module's functions by name: put the tests folder on their path."""
    return _plan_launch(n, env={"PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}, **kw)


def wait_dead(pids, timeout_s=30):
    import psutil

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return []
        time.sleep(0.05)
    return alive


def exit_after_stderr(rank):
    """Rank 1 says why on stderr (Python's, buffered in the engine) and leaves at once, as a factory may."""
    import os
    import sys
    import time
    if rank == 1:
        print("factory: cannot load the weights, giving up", file=sys.stderr)
        os._exit(3)
    time.sleep(60)


def test_an_engine_that_exits_is_named_by_rank_with_its_exit_code_and_last_line():
    run = start_engines(plan_launch(2, framework="mlx"))
    pids = list(run.pids.values())
    with pytest.raises(EngineFailure) as info:
        run.apply(exit_after_stderr, [(0,), (1,)], timeout_s=120)
    message = str(info.value)
    assert info.value.rank == 1
    assert message.startswith("rank 1 failed (EngineError): the engine of rank 1 died (exit code 3)"), message
    assert "its output ended:\nfactory: cannot load the weights, giving up" in message, message
    assert not re.search(r"Engine \d+ died", message), message  # ipyparallel's engine id is not the rank
    assert wait_dead(pids) == []


def test_an_engine_gone_before_its_task_is_sent_is_named_by_rank_and_every_engine_stops():
    """An engine that dies between the start and the tasks: once the controller has dropped it, the client
    no longer knows its id; the run fails naming the rank (the fresh check once raised IndexError here)."""
    run = start_engines(plan_launch(2, framework="mlx"))
    pids = list(run.pids.values())
    gone = run.rank_engine[1]
    os.kill(run.pids[1], 9)
    deadline = time.monotonic() + 30
    while gone in run.client.ids and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone not in run.client.ids, "the controller never dropped the killed engine"
    with pytest.raises(EngineFailure) as info:
        run.apply(exit_after_stderr, [(0,), (2,)], timeout_s=60)
    assert info.value.rank == 1
    assert str(info.value).startswith("rank 1 failed (EngineError): the engine of rank 1 died (killed by SIGKILL"), info.value
    assert wait_dead(pids) == [] and run.cluster is None  # the other engine and the controller stopped too


def say_then_die(how):
    """Print (Python's stdout, buffered in the engine), write natively, then die by ``how``."""
    import os
    import signal
    print(f"last python words before {how}")
    os.write(2, b"\xff\xfe not UTF-8, then native words before " + how.encode() + b"\n")
    os.kill(os.getpid(), getattr(signal, how))


def test_signals_reach_the_report_with_the_last_words_of_each_rank_and_the_cluster_still_stops():
    """Three ranks die three ways on one cluster; each report is read as the run's error reads it. Their
    logs hold bytes that are not UTF-8, on which ipyparallel's own stop raised and left files behind."""
    hows = ["SIGSEGV", "SIGBUS", "SIGKILL"]
    run = start_engines(plan_launch(len(hows), framework="mlx"))
    logs = [sub.output_file for r in range(len(hows)) for sub in run.engine_launchers[r]]
    cluster_file = run.cluster.cluster_file
    try:
        pids = [run.pids[r] for r in range(len(hows))]
        alive = run.death_report(0, wait_s=0.2)  # as when the controller gives up on a wedged engine's heartbeat
        assert alive.startswith("the engine of rank 0 died (the controller lost it (missed heartbeats?), though "
                                "its process still ran 0.2 s later)"), alive
        for r, how in enumerate(hows):
            run.client[run.rank_engine[r]].apply_async(say_then_die, how)
        assert wait_dead(pids) == []
        expected = ["killed by SIGSEGV (a crash in native code)", "killed by SIGBUS", "killed by SIGKILL"]
        for r, (how, cause) in enumerate(zip(hows, expected)):
            report = run.death_report(r)
            assert report.startswith(f"the engine of rank {r} died ({cause}"), report
            assert f"last python words before {how}" in report, report
            assert f"not UTF-8, then native words before {how}" in report, report
        segv = run.death_report(0)
        assert "Fatal Python error: Segmentation fault" in segv and "in say_then_die" in segv, segv
        assert "[KernelNanny" not in segv and "Handling apply_request" not in segv, segv
    finally:
        run.stop()
    assert len(logs) == 3 and not any(os.path.exists(log) for log in logs)
    assert not os.path.exists(cluster_file)


def test_last_words_drop_ipyparallel_chatter_and_fold_a_long_crash_stack():
    log = "\n".join([
        "2026-11-26 13:55:16.577 [IPEngine] Loading connection info from $IPP_CONNECTION_INFO",
        "2026-11-26 13:55:17.588 [IPEngine.0] Handling apply_request: de2575bf",
        "2026-11-26 13:55:17.603 [IPEngine.0] ERROR | something ipyparallel says matters",
        "\x1b[31mrank says: bad vocab\x1b[0m",
        "Fatal Python error: Segmentation fault",
        "",
        "Current thread 0x00007f (most recent call first):",
        *[f'  File "/x/f{i}.py", line {i} in f{i}' for i in range(20)],
        "",
        "Extension modules: " + ", ".join(f"mod{i}" for i in range(200)),
        "2026-11-26 13:55:41.563 [KernelNanny.0] Pipe closed, parent 13624 has status: zombie",
    ])
    words = last_words(log)
    lines = words.splitlines()
    assert lines[0] == "2026-11-26 13:55:17.603 [IPEngine.0] ERROR | something ipyparallel says matters"
    assert lines[1] == "rank says: bad vocab"
    assert 'in f0' in words and 'in f5' in words and 'in f6' not in words
    assert "  ... (14 outer frames)" in lines
    assert lines[-1].startswith("Extension modules: mod0") and lines[-1].endswith(" ...") and len(lines[-1]) < 310
    assert "Handling apply_request" not in words and "KernelNanny" not in words


def test_describe_exit_names_the_signal_or_the_code():
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(-11) == "killed by SIGSEGV (a crash in native code)"
    assert describe_exit(-7).startswith("killed by SIGBUS")
    assert describe_exit(-15) == "killed by SIGTERM"
    assert describe_exit(None) == "exit status unknown"


def test_an_engine_started_through_ssh_is_neither_waited_for_nor_read_as_a_local_one():
    """Its launcher's process is the ssh client and its ``output_file`` the client's log, not the engine's."""
    from ipyparallel.cluster.launcher import LocalEngineLauncher, SSHEngineLauncher

    ssh = SSHEngineLauncher()
    t0 = time.monotonic()
    assert not is_local_engine(ssh) and exit_status(ssh, wait_s=30) == (False, None)
    assert time.monotonic() - t0 < 5
    assert is_local_engine(LocalEngineLauncher())

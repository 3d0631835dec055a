"""Real ipyparallel engines: per-rank environments, failures naming the rank, no orphans."""

import os
import time

import pytest

from workbench.launch.engines import EngineFailure, start_engines
from workbench.launch.plan import plan_launch as _plan_launch

HERE = os.path.dirname(os.path.abspath(__file__))


def plan_launch(n, **kw):
    """Engines import this module's functions by name: put the tests folder on their path."""
    return _plan_launch(n, env={"PYTHONPATH": HERE}, **kw)


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def wait_dead(pids, timeout_s=15):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def env_of_rank(name):
    import os
    return os.environ.get(name)


def test_engines_carry_their_rank_environment_and_stop_cleanly():
    plan = plan_launch(2, framework="mlx", backend="ring")
    with start_engines(plan) as run:
        assert sorted(run.rank_engine) == [0, 1]
        got = run.apply(env_of_rank, [("MLX_RANK",), ("MLX_RANK",)], timeout_s=30)
        assert got == ["0", "1"]
        hostfiles = run.apply(env_of_rank, [("MLX_HOSTFILE",)] * 2, timeout_s=30)
        assert hostfiles[0] == hostfiles[1] and os.path.exists(hostfiles[0])
        pids = list(run.pids.values())
        assert len(pids) == 2 and all(alive(p) for p in pids)  # both engines are local: both killable
    assert wait_dead(pids) == []


def die_if_rank_one(rank):
    import os
    import time
    if rank == 1:
        time.sleep(0.5)
        os.write(2, b"native code says why: rank 1 aborts\n")  # as an abort in C++ would, on fd 2
        os._exit(9)
    time.sleep(60)


def test_a_killed_engine_fails_the_run_naming_the_rank_and_stops_the_others():
    run = start_engines(plan_launch(2, framework="mlx"))
    pids = list(run.pids.values())
    t0 = time.monotonic()
    with pytest.raises(EngineFailure, match=r"rank 1 failed \(EngineError\).*died") as info:
        run.apply(die_if_rank_one, [(0,), (1,)], timeout_s=60)
    assert info.value.rank == 1
    assert "rank 1 died (exit code 9); its output ended:" in str(info.value), str(info.value)
    assert "native code says why: rank 1 aborts" in str(info.value)
    assert time.monotonic() - t0 < 30
    assert wait_dead(pids) == []


def abort_at_once(rank):
    """Write to fd 2 and exit in the same instant, as a native abort does."""
    import os
    os.write(2, f"native abort of rank {rank}\n".encode())
    os._exit(6)


def test_native_output_written_just_before_an_engine_dies_is_in_its_log(monkeypatch):
    """ipykernel captured the engines' fd 2 through a pipe and a thread: a process that exited right
    after writing lost the line whenever that thread had not run yet, and under load the run's error
    quoted an empty log (issue 14's flaky test). The engines now write fd 2 straight to their log."""
    monkeypatch.delenv("PYTEST_CURRENT_TEST")  # ipykernel never captures under pytest: start them as a user does
    run = start_engines(plan_launch(2, framework="mlx"))
    try:
        pids = list(run.pids.values())
        for r in (0, 1):
            run.client[run.rank_engine[r]].apply_async(abort_at_once, r)
        assert wait_dead(pids) == []
        assert "native abort of rank 0" in run.output_tail(0)
        # Rank 1 as in a notebook, whose kernel runs ipyparallel's event loop: the exit is noticed (the
        # call its loop makes), the output moves into the set's ``outputs`` and the log file is deleted.
        (engine,) = run.launchers[1].launchers.values()
        engine.notify_stop({"exit_code": 6, "pid": engine.pid, "identifier": engine.identifier})
        assert not run.launchers[1].launchers and not os.path.exists(engine.output_file)
        assert "native abort of rank 1" in run.output_tail(1)
    finally:
        run.stop()


def test_a_timeout_and_an_interrupt_stop_every_engine():
    run = start_engines(plan_launch(2, framework="jax"))
    pids = list(run.pids.values())
    with pytest.raises(EngineFailure, match="did not finish within 1 s"):
        run.apply(time.sleep, [(30,), (30,)], timeout_s=1)
    assert wait_dead(pids) == []

    run = start_engines(plan_launch(2, framework="jax"))
    pids = list(run.pids.values())

    def interrupt():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run.apply(time.sleep, [(30,), (30,)], timeout_s=60, on_poll=interrupt)
    assert wait_dead(pids) == []


def test_a_controller_whose_stop_fails_is_still_killed(monkeypatch):
    """The stop of ipyparallel's cluster can fail or time out under load; the controller must not outlive the run."""
    import psutil

    run = start_engines(plan_launch(1, framework="jax"))
    group = os.getpgid(run.cluster.controller.pid)
    members = [p for p in psutil.process_iter(["cmdline"]) if _in_group(p, group)]
    assert members and group != os.getpgrp()
    monkeypatch.setattr(run.cluster, "stop_cluster_sync", lambda: (_ for _ in ()).throw(TimeoutError()), raising=False)
    run.stop()
    assert wait_dead([p.pid for p in members]) == []


def _in_group(proc, group: int) -> bool:
    try:
        return os.getpgid(proc.pid) == group
    except OSError:
        return False


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range():
    import socket

    from workbench.launch.plan import ephemeral_port_range, free_ports

    low, high = ephemeral_port_range()
    assert 1024 <= low < high
    ports = free_ports(8)
    assert len(set(ports)) == 8 and all(1024 <= p < low for p in ports)
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))  # free now
    # The driver seeds Python's global generator as it builds a user's model (init_seed): two drivers that had
    # done so drew the same ports, and one run's last rank joined the other's rank 0. The draw ignores that seed.
    import random

    random.seed(0)
    first = free_ports(4)
    random.seed(0)
    assert free_ports(4) != first


def identity_or_silence(mark: str | None = None):
    """An engine's first task in place of ``rank_identity``: rank 1 never answers (the first time only, where
    ``mark`` names a file it leaves behind)."""
    import os

    from workbench.launch.engines import rank_identity

    if os.environ["WORKBENCH_RANK"] == "1" and not (mark and os.path.exists(mark)):
        if mark:
            open(mark, "w").close()
        time.sleep(600)
    return rank_identity()


def engine_processes() -> list[int]:
    import psutil

    return [p.pid for p in psutil.Process().children(recursive=True)
            if "ipyparallel.engine" in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE]


def test_an_engine_that_registers_but_never_answers_fails_the_start_and_is_killed(monkeypatch):
    """CI once lost a pool's JAX start to one engine that registered and never answered ("Result not ready")."""
    import workbench.launch.engines as engines

    monkeypatch.setattr(engines, "rank_identity", identity_or_silence)
    monkeypatch.setattr(engines, "ANSWER_S", 1.0)
    with pytest.raises(EngineFailure, match=r"registered but did not answer within \d+ s \(rank 1 wrote") as failed:
        start_engines(plan_launch(2, framework="mlx"))  # registering has its own 60 s: under load it took over 1 s
    assert failed.value.unanswered and "rank 0 wrote" not in str(failed.value)
    assert wait_dead(engine_processes()) == []  # the silent engine too, though it never said its pid


def test_a_start_whose_engine_never_answers_is_launched_again(monkeypatch, tmp_path):
    import workbench.launch.engines as engines
    import workbench.launch.relaunch as relaunch

    mark = str(tmp_path / "silent-once")
    monkeypatch.setattr(engines, "rank_identity", lambda: identity_or_silence(mark))
    monkeypatch.setattr(engines, "ANSWER_S", 1.0)
    plans = []
    monkeypatch.setattr(relaunch, "plan_launch", lambda n, **kw: plans.append(plan_launch(n, **kw)) or plans[-1])
    ranks = relaunch.run_on_fresh_ports(2, "mlx", lambda run: run.apply(env_of_rank, [("WORKBENCH_RANK",)] * 2,
                                                                        timeout_s=30))
    assert ranks == ["0", "1"] and len(plans) == 2 and os.path.exists(mark)
    assert wait_dead(engine_processes()) == []

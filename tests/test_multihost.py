"""Runs across hosts, on the multi-host rig (scripts/hosts_rig): engines started by ipyparallel's own
launchers (ssh, mpiexec), MLX ring and JAX gloo across the rig's bridge, and the faults a cluster has.

The pure parts (hosts files, the multi-host plan, what the launchers are told) need no rig. The rest is
skipped, with the reason, where the rig cannot be built. Every cross-host run must end on the loss of
the same spec on one host (test_training's tolerance) and its record must name every rank's host.
``WORKBENCH_FULL=1`` adds every strategy x layout x framework x launcher combination.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

pytest.register_assert_rewrite("rig")
from rig import hosts_rig, ssh

from workbench.launch.driver import run_training
from workbench.launch.engine_env import rank_environment
from workbench.launch.hosts import (
    Host,
    HostsFile,
    load_hosts,
    parse_hosts,
    plan_hosts_launch,
)
from workbench.launch.remote_cmd import ENGINE_MODULE, engine_env, mpi_args, openmpi_hostfile
from workbench.runs.spec import RunSpec
from workbench.runs.tables import load_runs
from workbench.strategies import get_strategy

pytest_plugins = ["rig"]

TINY = dict(vocab_size=32, seq_len=16, dim=32, num_layers=1, num_heads=2, mlp_dim=64)
FULL = os.environ.get("WORKBENCH_FULL") == "1"
STEPS = 4


def spec(framework="mlx", num_ranks=2, **kw):
    return RunSpec(**{"framework": framework, "num_ranks": num_ranks, "steps": STEPS, "global_batch": 8, "model": TINY,
                      **kw})


def rig_hosts(rig, slots=1):
    return load_hosts(Path(rig["state_dir"]) / "rig.json", slots=slots)


# ------------------------------------------------------------------------------------------ pure parts


def test_a_toml_hosts_file_is_loaded_and_validated(tmp_path):
    path = tmp_path / "hosts.toml"
    path.write_text('controller_ip = "10.0.0.1"\nssh_config = "/etc/ssh/cfg"\n'
                    '[[hosts]]\naddress = "10.0.0.11"\nslots = 2\nuser = "me"\npython = "/opt/py/bin/python"\n'
                    'cores = 32\n[[hosts]]\naddress = "node2"\nport = 2222\n')
    hf = load_hosts(path)
    assert hf.controller_ip == "10.0.0.1" and hf.ssh_config == "/etc/ssh/cfg" and hf.num_slots == 3
    assert hf.hosts[0] == Host(address="10.0.0.11", slots=2, user="me", python="/opt/py/bin/python", cores=32)
    assert hf.hosts[1].cores is None  # as many as this machine has
    assert hf.hosts[1].address == "node2" and hf.hosts[1].user is None and hf.hosts[1].port == 2222 and hf.hosts[1].python == "python3"
    assert load_hosts(path, slots=4).num_slots == 8


@pytest.mark.parametrize("entry, message", [
    ({"address": "0.0.0.0"}, "wildcard or loopback"),
    ({"address": "127.0.0.1"}, "wildcard or loopback"),
    ({"address": "10.0.0.1", "slots": 0}, "Host.slots=0"),
    ({"address": "10.0.0.1", "port": 70000}, "Host.port=70000"),
    ({"address": "10.0.0.1", "cores": 0}, "Host.cores=0"),
    ({"address": "10.0.0.1", "cores": "8; rm -rf ~"}, "Host.cores='8; rm -rf ~'"),
    ({"address": "10.0.0.1", "cores": 2.5}, "Host.cores=2.5"),
    ({"slots": 2}, r"hosts\[0\] has no 'address'"),
])
def test_a_bad_host_is_refused_naming_the_field(entry, message):
    with pytest.raises(ValueError, match=message):
        parse_hosts({"hosts": [entry]})


def test_a_host_listed_twice_is_refused():
    with pytest.raises(ValueError, match="listed twice"):
        parse_hosts({"hosts": [{"address": "10.0.0.1"}, {"address": "10.0.0.1"}]})


def test_the_plan_puts_ranks_on_hosts_in_slot_order_with_real_addresses():
    hosts = HostsFile(hosts=(Host(address="10.0.0.11", slots=2), Host(address="10.0.0.12", slots=2)))
    plan = plan_hosts_launch(hosts, framework="mlx", ports=[20001, 20002, 20003, 20004])
    assert plan.rank_hosts == (0, 0, 1, 1)
    assert plan.hostfile == [["10.0.0.11:20001"], ["10.0.0.11:20002"], ["10.0.0.12:20003"], ["10.0.0.12:20004"]]
    assert [e["MLX_RANK"] for e in plan.rank_env] == ["0", "1", "2", "3"]
    jax = plan_hosts_launch(hosts, 3, framework="jax", ports=[20005])
    assert jax.coordinator == "10.0.0.11:20005" and jax.rank_hosts == (0, 0, 1)
    assert {e["WORKBENCH_COORDINATOR"] for e in jax.rank_env} == {"10.0.0.11:20005"}
    assert openmpi_hostfile(jax) == "10.0.0.11 slots=2\n10.0.0.12 slots=1\n"
    with pytest.raises(ValueError, match="only 4 slots"):
        plan_hosts_launch(hosts, 5)


def test_each_engine_finds_its_rank_environment_from_its_launcher(tmp_path):
    hosts = HostsFile(hosts=(Host(address="10.0.0.11"), Host(address="10.0.0.12")))
    plan = plan_hosts_launch(hosts, framework="mlx", ports=[20001, 20002])
    env = engine_env(plan)
    assert json.loads(env["WORKBENCH_MLX_HOSTFILE_JSON"]) == plan.hostfile
    for launcher_var in ("WORKBENCH_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        got = rank_environment({**env, launcher_var: "1"})
        assert got["MLX_RANK"] == "1" and got["WORKBENCH_RANK"] == "1"
    args = mpi_args(plan, "10.0.0.1", tmp_path, ["-F", "cfg"])
    assert args[args.index("--hostfile") + 1] == str(tmp_path / "openmpi-hostfile")
    assert "10.0.0.1/32,10.0.0.11/32,10.0.0.12/32" in args and "IPP_CONNECTION_INFO" in args
    assert args[args.index("OMPI_MPI_THREAD_LEVEL=3") - 1] == "-x"  # MLX calls MPI from several threads


# ------------------------------------------------------------------------------------------ on the rig


def _losses(root, run_id):
    steps = load_runs(root).steps
    rows = steps[steps.run_id == run_id]
    return rows.groupby("step").loss.mean().to_numpy(), rows


@pytest.fixture(scope="module")
def one_host(tmp_path_factory):
    """The one-host references: every strategy gives DDP's curve there (test_training), so DDP's is the reference."""
    root = tmp_path_factory.mktemp("one-host")
    refs = {}
    for framework, n in [("mlx", 2), ("jax", 2), ("mlx", 4), ("jax", 4)] if FULL else [("mlx", 2), ("jax", 4)]:
        outcome = run_training(spec(framework, n), root)
        assert outcome.status == "done", outcome.error
        refs[framework, n] = _losses(root, outcome.run_id)[0]
    return refs


# JAX's 2 hosts of 2: HSDP, a shard group per host, its gradient all-reduced across the hosts
CROSS = [("mlx", 1, "fsdp-row", "ssh"), ("jax", 2, "hsdp-row", "ssh"), ("mlx", 1, "fsdp-full", "mpi")]
if FULL:
    CROSS = [(f, s, st, la) for f in ("mlx", "jax") for s in (1, 2) for st in ("ddp", "fsdp-row", "fsdp-flat", "fsdp-full")
             for la in ("ssh", "mpi")] + [("jax", 2, "hsdp-row", la) for la in ("ssh", "mpi")]


@pytest.mark.parametrize("framework, slots, strategy, launcher", CROSS)
def test_a_run_across_hosts_ends_on_the_one_host_loss(multihost_rig, one_host, tmp_path, framework, slots, strategy,
                                                     launcher):
    n = 2 * slots
    if (framework, n) not in one_host:
        pytest.skip("the one-host reference of this size runs with WORKBENCH_FULL=1")
    groups = dict(num_replicas=2) if get_strategy(strategy).replicas else {}  # one group per host
    outcome = run_training(spec(framework, n, strategy=strategy, **groups), tmp_path,
                           hosts=rig_hosts(multihost_rig, slots), launcher=launcher, startup_timeout_s=120)
    assert outcome.status == "done", outcome.error
    curve, rows = _losses(tmp_path, outcome.run_id)
    assert sorted(zip(rows.step, rows["rank"])) == [(s, r) for s in range(STEPS) for r in range(n)]
    np.testing.assert_allclose(curve, one_host[framework, n], rtol=1e-5)
    record = load_runs(tmp_path).runs.set_index("run_id").loc[outcome.run_id]
    placements = [r["placement"] for r in record["summary.ranks"]]
    hosts = multihost_rig["hosts"]
    assert [p["hostname"] for p in placements] == [hosts[r // slots]["hostname"] for r in range(n)]
    assert [p["address"] for p in placements] == [hosts[r // slots]["address"] for r in range(n)]


def _listening(pid: int) -> list[str]:
    out = subprocess.run(["ss", "-H", "-l", "-t", "-n", "-p"], capture_output=True, text=True, timeout=10).stdout
    return [line.split()[3] for line in out.splitlines() if f"pid={pid}," in line]


def test_the_controller_listens_only_on_the_rig_address_and_requires_its_key(multihost_rig):
    from workbench.launch.remote import start_remote_engines

    hf = rig_hosts(multihost_rig)
    plan = plan_hosts_launch(hf, framework="jax")
    with start_remote_engines(plan, controller_ip=hf.controller_ip, ssh_config=hf.ssh_config) as run:
        addresses = _listening(run.cluster.controller.process.pid)
        assert addresses and {a.rsplit(":", 1)[0] for a in addresses} == {multihost_rig["head_address"]}
        info = json.loads(Path(run.cluster.controller.connection_files["client"]).read_text())
        assert len(info["key"]) >= 32 and info["signature_scheme"].startswith("hmac-")
        assert [h["hostname"] for h in run.record()] == [h["hostname"] for h in multihost_rig["hosts"]]


# ------------------------------------------------------------------------------------------ faults


def _host_processes(rig) -> dict[str, list[str]]:
    """What the runs left on each host: sshd's own processes (its listener, and a session whose client
    vanished with the link, which sshd drops when TCP gives up) are the host's, not the run's."""
    left = {}
    for h in rig["hosts"]:
        pids = hosts_rig._pids_in_netns([h["netns"]])
        left[h["name"]] = [hosts_rig._cmdline(p)[:100] for p in pids if hosts_rig._alive(p) and not hosts_rig._is_sshd(p)]
    return left


def _wait_until_hosts_idle(rig, bound_s: float) -> dict:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if not any(_host_processes(rig).values()):
            return {}
        time.sleep(0.2)
    return {k: v for k, v in _host_processes(rig).items() if v}


# ipyparallel's ssh launcher watches each engine from a thread that runs ssh every minute; with the link
# down that ssh fails, and the thread (ipyparallel's, not ours) ends with an unhandled CalledProcessError.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_host_whose_link_goes_down_fails_the_run_naming_rank_and_host(multihost_rig, tmp_path):
    rig, victim = multihost_rig, multihost_rig["hosts"][1]
    holder = {}

    def cut_after_two_steps(done):
        if done >= 2 and "cut_at" not in holder:
            subprocess.run(["ip", "link", "set", victim["veth"], "down"], check=True, timeout=10)
            holder["cut_at"] = time.monotonic()

    try:
        outcome = run_training(spec("mlx", 2, strategy="fsdp-row", steps=400), tmp_path, hosts=rig_hosts(rig),
                               progress=cut_after_two_steps)
        failed_at = time.monotonic()
        assert outcome.status == "failed", outcome
        assert failed_at - holder["cut_at"] < 30, failed_at - holder["cut_at"]
        assert outcome.rank == 1 and f"rank 1 on host {victim['name']}" in outcome.error, outcome.error
        loaded = load_runs(tmp_path)
        assert loaded.runs.iloc[0]["status"] == "failed" and loaded.problems == []
        assert len(loaded.steps) >= 2 * 2 and set(loaded.steps["rank"]) == {0, 1}  # the stored steps are intact
        assert _wait_until_hosts_idle(rig, 20) == {}  # the cut-off engine stopped itself; the other was stopped
    finally:
        subprocess.run(["ip", "link", "set", victim["veth"], "up"], check=True, timeout=10)


def test_a_host_unreachable_at_start_is_named_within_the_startup_timeout(multihost_rig, tmp_path):
    rig, victim = multihost_rig, multihost_rig["hosts"][1]
    subprocess.run(["ip", "link", "set", victim["veth"], "down"], check=True, timeout=10)
    try:
        t0 = time.monotonic()
        outcome = run_training(spec("jax", 2), tmp_path, hosts=rig_hosts(rig), startup_timeout_s=30)
        assert time.monotonic() - t0 < 30
        assert outcome.status == "failed"
        assert f"host {victim['name']} ({victim['address']}:{victim['port']}) unreachable" in outcome.error, outcome.error
        assert rig["hosts"][0]["address"] not in outcome.error  # only the host at fault is named
    finally:
        subprocess.run(["ip", "link", "set", victim["veth"], "up"], check=True, timeout=10)
    assert _wait_until_hosts_idle(rig, 10) == {}


@pytest.mark.parametrize("fault", ["no python", "no engine"])
def test_a_host_whose_engine_cannot_start_is_the_one_named(multihost_rig, tmp_path, fault):
    """Both hosts answer ssh, but on one the hosts file's ``python`` is not a Python (ipyparallel's first command
    there fails) or runs everything but the engine (which never registers): the run fails within its startup
    bound naming that host only (before, the command's exit or every host, as no engine had been identified)."""
    rig, victim = multihost_rig, multihost_rig["hosts"][1]
    python = "/bin/false"
    if fault == "no engine":
        python = str(tmp_path / "python-without-engine")
        Path(python).write_text(f'#!/bin/sh\n[ "$2" = "{ENGINE_MODULE}" ] && exit 1\nexec python3 "$@"\n')
        Path(python).chmod(0o755)
    hosts = rig_hosts(rig)
    broken = dataclasses.replace(hosts, hosts=tuple(dataclasses.replace(h, python=python)
                                                    if h.address == victim["address"] else h for h in hosts.hosts))
    t0 = time.monotonic()  # the engines' start is bounded by run_training's startup_timeout_s (before: 60 s)
    outcome = run_training(spec("mlx", 2), tmp_path, hosts=broken, startup_timeout_s=10)
    assert time.monotonic() - t0 < 25, "the startup bound was not kept"
    named = (f"host {victim['name']} ({victim['address']}:{victim['port']}): a command of its python '/bin/false' "
             "exited 1" if fault == "no python" else f"no engine answered from {victim['name']})")
    error = outcome.error
    assert outcome.status == "failed" and named in error, error
    assert rig["hosts"][0]["address"] not in error and f"from {rig['hosts'][0]['name']}" not in error
    assert _wait_until_hosts_idle(rig, 10) == {}


def test_an_engine_killed_on_a_remote_host_fails_the_run_within_the_local_bound(multihost_rig, tmp_path):
    rig = multihost_rig
    holder = {}

    def keep(engines):
        holder["engines"] = engines

    def kill_rank_one_after_two_steps(done):
        if done >= 2 and "killed_at" not in holder:
            placement = holder["engines"].rank_hosts[1]
            ssh(rig, placement["address"], f"kill -9 {placement['pid']}", timeout=10)
            holder["killed_at"] = time.monotonic()

    outcome = run_training(spec("mlx", 2, strategy="fsdp-flat", steps=400), tmp_path, hosts=rig_hosts(rig),
                           on_engines=keep, progress=kill_rank_one_after_two_steps)
    assert outcome.status == "failed" and outcome.rank == 1, outcome
    assert time.monotonic() - holder["killed_at"] < 30  # test_training's bound for a killed local engine
    assert f"rank 1 on host {rig['hosts'][1]['name']}" in outcome.error, outcome.error
    assert len(load_runs(tmp_path).steps) >= 2 * 2
    assert _wait_until_hosts_idle(rig, 20) == {}


# ------------------------------------------------------------------------------------------ collectives


@pytest.fixture(scope="module")
def cross_benchmark(multihost_rig, tmp_path_factory) -> Path:
    """The MLX collective benchmark across the rig's 2 hosts (a rank each), run once for the module: its run folder.
    4 KiB to 64 MiB, as test_collectives: at 4 MiB the largest message was still within the noise of a loaded CI
    machine and the fit's bandwidth came out negative (CI, stop 35)."""
    from workbench.launch.benchmark import SMALL_SIZES, run_collective_benchmark

    root = tmp_path_factory.mktemp("cross-benchmark")
    return root / run_collective_benchmark(root, "mlx", 2, sizes_bytes=SMALL_SIZES, iters=3, hosts=rig_hosts(multihost_rig))


def stored_beside(run: Path, root: Path) -> str:
    """Copies the run folder ``run`` into the run store ``root``; its run id."""
    shutil.copytree(run, root / run.name)
    return run.name


def test_the_collective_benchmark_runs_across_hosts_and_is_stored_beside_loopback(multihost_rig, cross_benchmark,
                                                                                   tmp_path):
    from workbench.studies.design_review import reference_runs_dir
    from workbench.studies.step_time import fit_links, load_collective_benchmarks

    # loopback's: the committed MLX benchmark (2 ranks, measured quiet; test_collectives runs one here). One run
    # here beside the rig's, under the suite's load, once timed all_gather no slower at larger sizes, and no link fit
    local = stored_beside(next(reference_runs_dir("collectives").glob("mlx-*")), tmp_path)
    cross = stored_beside(cross_benchmark, tmp_path)
    assert local != cross
    table = load_collective_benchmarks(tmp_path)
    assert set(table.run_id) == {local, cross}
    placements = dict(zip(table.run_id, table.placement))
    assert placements == {local: "loopback", cross: "2 hosts (ssh)"}
    fits = {run: fit_links(table, placements[run]) for run in (local, cross)}  # one link per placement, never mixed
    for run in (local, cross):
        assert set(fits[run]) == {("mlx", k) for k in ("all_reduce", "all_gather", "reduce_scatter")}
    assert fits[local] != fits[cross]
    record = json.loads((tmp_path / cross / "record.json").read_text()) if (tmp_path / cross / "record.json").exists() else None
    if record is not None:
        assert record["spec"]["placement"]["launcher"] == "ssh"
        assert [r["placement"]["hostname"] for r in record["summary"]["ranks"]] == [
            h["hostname"] for h in multihost_rig["hosts"]]


# ------------------------------------------------------------------------------------------ the plan advisor


def test_plan_validate_across_two_hosts_picks_a_plan_that_fits_when_ddp_does_not(multihost_rig, cross_benchmark,
                                                                                    tmp_path, capsys):
    """Issue 27 on the rig: ``plan --hosts rig.json --validate`` (2 hosts, a rank each), where DDP does not fit and
    an FSDP plan does. The advisor prices the collectives by the benchmark stored across these hosts (never by
    loopback's links), and runs the pick, the runner-up and the smallest whole-parameter plan there, as ordinary
    runs naming every rank's host. The same assertions as on 2 local ranks (test_plan_validate)."""
    from test_plan_validate import check_plan_validate

    hosts_file = Path(multihost_rig["state_dir"]) / "rig.json"
    runs = tmp_path / "runs"
    runs.mkdir()
    bench = stored_beside(cross_benchmark, runs)
    out = check_plan_validate(runs, capsys, ["--hosts", str(hosts_file)], dict(hosts=hosts_file), tmp_path,
                              "2 hosts (ssh)", benchmark=f"stored collective benchmark {bench}")
    loaded = load_runs(runs)
    names = [h["hostname"] for h in multihost_rig["hosts"]]
    for v in out["validated"]:
        ranks = loaded.runs.set_index("run_id").loc[v["run_id"], "summary.ranks"]
        assert [r["placement"]["hostname"] for r in ranks] == names, v["role"]
    print({v["role"]: (v["strategy"], v["communication_size"], f"{v['measured_step_s']:.3f} s",
                       f"{v['predicted_step_s']:.3f} s predicted") for v in out["validated"]})

"""The multi-host rig (the package scripts/hosts_rig): hosts that are network namespaces with their own sshd.

Each test asserts what a run across hosts relies on: ssh into every host, the repository's Python
there, hosts reaching each other and the root namespace over the rig's bridge and nothing beyond it,
and a teardown that leaves nothing behind (also after a crashed ``up``). Skipped, with the reason,
where the rig cannot be built (it needs root, iproute2, network namespaces and sshd).
"""

from __future__ import annotations

import json
import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

pytest.register_assert_rewrite("rig")  # imported here before pytest_plugins loads it
from rig import ROOT, hosts_rig, rig_or_skip, ssh

pytest_plugins = ["rig"]

SCRIPT = ROOT / "scripts" / "hosts_rig"  # the package; `python scripts/hosts_rig ...` runs its __main__
T = 60  # seconds: the bound on every subprocess here

SERVER = textwrap.dedent("""
    import socket, sys
    s = socket.socket()
    s.settimeout(30)
    s.bind((sys.argv[1], 0))
    s.listen(1)
    print(s.getsockname()[1], flush=True)
    conn, peer = s.accept()
    conn.sendall(f"{socket.gethostname()} saw {peer[0]}\\n".encode())
    conn.close()
""")
CLIENT = textwrap.dedent("""
    import socket, sys
    conn = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
    print(socket.gethostname(), "got", conn.makefile().readline().strip())
""")


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=T, check=True).stdout


def _netns_names() -> set[str]:
    return {line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()}


def _link_names() -> set[str]:
    return {line.split(":", 2)[1].strip().split("@")[0] for line in _ip("-o", "link", "show").splitlines()}


def _running(pid: int) -> bool:
    """Exists and is not a zombie (pid 1 of some VMs never reaps the daemons it inherits)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _rig_names(desc: dict) -> tuple[set[str], set[str]]:
    return {h["netns"] for h in desc["hosts"]}, {desc["bridge"]} | {h["veth"] for h in desc["hosts"]}


def _assert_gone(desc: dict, other_pids=()):
    netns, links = _rig_names(desc)
    assert not netns & _netns_names(), "namespaces left"
    assert not links & _link_names(), "bridge or veth left"
    assert not [n for n in _link_names() | _netns_names() if n.startswith(desc["rig_id"])]
    assert not any((Path("/etc/netns") / n).exists() for n in netns)
    pids = [h["sshd_pid"] for h in desc["hosts"]] + list(other_pids)
    assert all(pids) and not [p for p in pids if _running(p)], "sshd or a process started on a host is still running"


def _require_rig():
    """Skip (with the reason) where the rig cannot be built; for tests that build it other than through the fixture."""
    try:
        hosts_rig.check_support()
    except hosts_rig.RigUnavailable as e:
        pytest.skip(f"multi-host rig cannot be built here: {e}")


def _run_script(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], check=False, capture_output=True, text=True, timeout=T, **kw)


# ------------------------------------------------------------------------------------------ the hosts


def test_ssh_reaches_each_host_in_its_own_namespace(multihost_rig):
    rig = multihost_rig
    for host in rig["hosts"]:
        out = ssh(rig, host, "ip -o -4 addr show; echo HOSTNAME $(hostname)", timeout=T).stdout
        assert f"inet {host['address']}/24 " in out
        others = [h["address"] for h in rig["hosts"] if h is not host] + [rig["head_address"]]
        assert not [a for a in others if f"inet {a}/" in out]  # its own namespace, not the root's
        assert f"HOSTNAME {host['hostname']}" in out


def test_repository_python_runs_on_each_host(multihost_rig):
    rig = multihost_rig
    code = "import os, socket, sys; print(socket.gethostname(), sys.prefix, os.path.exists(sys.argv[1]))"
    for host in rig["hosts"]:
        assert host["python"] == sys.executable
        out = ssh(rig, host, [host["python"], "-c", code, str(ROOT / "pyproject.toml")], timeout=T).stdout.split()
        assert out == [host["hostname"], sys.prefix, "True"]


def test_hosts_reach_each_other_over_the_bridge(multihost_rig):
    rig = multihost_rig
    h1, h2 = rig["hosts"][:2]
    for server_host, client_host in ((h1, h2), (h2, h1)):
        serve = [server_host["python"], "-c", SERVER, server_host["address"]]
        server = subprocess.Popen(hosts_rig.ssh_argv(rig, server_host, serve),
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert select.select([server.stdout], [], [], T)[0], "the server on the first host never said its port"
            port = server.stdout.readline().strip()
            out = ssh(rig, client_host, [client_host["python"], "-c", CLIENT, server_host["address"], port], timeout=T).stdout
            assert out.split() == [client_host["hostname"], "got", server_host["hostname"], "saw", client_host["address"]]
            assert server.wait(timeout=T) == 0
        finally:
            server.kill()
            server.communicate(timeout=T)


def test_root_namespace_and_hosts_reach_each_other(multihost_rig):
    rig = multihost_rig
    for host in rig["hosts"]:
        with socket.create_connection((host["address"], host["port"]), timeout=10) as conn:
            assert conn.recv(64).startswith(b"SSH-2.0-OpenSSH")
    with socket.socket() as srv:  # where a controller would listen: the head address, not 0.0.0.0
        srv.settimeout(T)
        srv.bind((rig["head_address"], 0))
        srv.listen(len(rig["hosts"]))
        port = str(srv.getsockname()[1])
        for host in rig["hosts"]:
            client = subprocess.Popen(hosts_rig.ssh_argv(rig, host, [host["python"], "-c", CLIENT, rig["head_address"], port]),
                                      stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                conn, peer = srv.accept()
                with conn:
                    conn.sendall(b"head\n")
                out, err = client.communicate(timeout=T)
                assert peer[0] == host["address"]
                assert out.split() == [host["hostname"], "got", "head"], err
            finally:
                client.kill()
                client.communicate(timeout=T)


def test_hosts_have_no_route_off_the_rig(multihost_rig):
    rig = multihost_rig
    code = textwrap.dedent("""
        import errno, socket
        try:
            socket.create_connection(("192.0.2.1", 80), timeout=5)  # TEST-NET-1: no route, so no packet is sent
        except OSError as e:
            print(errno.errorcode.get(e.errno, e))
    """)
    for host in rig["hosts"]:
        routes = ssh(rig, host, "ip -4 route show table main", timeout=T).stdout.strip().splitlines()
        only_the_rig = [rig["subnet"], "dev", "eth0", "proto", "kernel", "scope", "link", "src", host["address"]]
        assert [r.split() for r in routes] == [only_the_rig]
        assert ssh(rig, host, [host["python"], "-c", code], timeout=T).stdout.strip() == "ENETUNREACH"


def test_sshd_listens_only_on_its_host_address(multihost_rig):
    rig = multihost_rig
    for host in rig["hosts"]:
        listening = ssh(rig, host, "ss -H -l -t -n", timeout=T).stdout.split("\n")
        local = sorted({line.split()[3] for line in listening if line.strip()})
        assert local == [f"{host['address']}:{host['port']}"]


def test_the_ssh_wrapper_logs_in_with_a_plain_address(multihost_rig):
    rig = multihost_rig
    env = dict(os.environ, PATH=f"{Path(rig['ssh']).parent}:{os.environ['PATH']}")
    for host in rig["hosts"]:
        out = subprocess.run(["ssh", host["address"], "hostname"], env=env, capture_output=True, text=True, timeout=T, check=True)
        assert out.stdout.strip() == host["hostname"]


def test_the_state_file_describes_the_rig(multihost_rig):
    rig = multihost_rig
    assert json.loads((Path(rig["state_dir"]) / "rig.json").read_text()) == rig
    assert rig["status"] == "up"
    addresses = [h["address"] for h in rig["hosts"]]
    assert len(set(addresses)) == len(addresses) and all(a.startswith("198.1") for a in addresses)
    for key in ("address", "port", "user", "python", "hostname", "netns", "veth", "sshd_pid"):
        assert all(h[key] for h in rig["hosts"]), key
    assert Path(rig["key"]).stat().st_mode & 0o077 == 0


# ------------------------------------------------------------------------------------------ clean-up


def test_down_leaves_nothing_and_a_second_down_is_harmless():
    with rig_or_skip(2) as rig:
        # something a test would leave behind: a daemon on a host, detached from the ssh session
        out = ssh(rig, 0, "setsid sleep 600 </dev/null >/dev/null 2>&1 & echo $!", timeout=T).stdout
        stray = int(out.strip())
        assert _running(stray)
        removed = hosts_rig.down(rig["state_dir"])
        assert removed[0].endswith(" processes") and int(removed[0].split()[0]) >= 3  # 2 sshd and the stray
        _assert_gone(rig, [stray])
        assert not Path(rig["state_dir"]).exists()
        assert hosts_rig.down(rig["state_dir"]) == []
        second = _run_script("down", "--state", rig["state_dir"])
        assert second.returncode == 0 and "nothing" in second.stdout


CRASHING_UP = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, sys.argv[1])
    import hosts_rig
    def crash(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)  # no except, no finally, no atexit: as if the machine pulled the plug
    setattr(hosts_rig.build, sys.argv[2], crash)  # the stage as up() finds it
    hosts_rig.up(2, sys.argv[3], prefix=sys.argv[4])
""")


def _crash_up_at(stage: str, state: Path, prefix: str) -> dict:
    _require_rig()
    proc = subprocess.run([sys.executable, "-c", CRASHING_UP, str(SCRIPT.parent), stage, str(state), prefix],
                          check=False, capture_output=True, text=True, timeout=T)
    if proc.returncode == 2 or "RigUnavailable" in proc.stderr:
        pytest.skip(f"multi-host rig cannot be built here: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    return json.loads((state / "rig.json").read_text())


@pytest.mark.parametrize("stage", ["_make_ssh_files", "_verify"])  # namespaces only; everything but the check
def test_down_cleans_up_after_a_crashed_up(tmp_path, stage):
    state = tmp_path / "state"
    rig = _crash_up_at(stage, state, "wbrig")
    netns, links = _rig_names(rig)
    try:
        assert rig["status"] == "building"
        assert netns <= _netns_names() and links <= _link_names()  # the crash left them: there is work for down
        if stage == "_verify":
            assert all(_running(h["sshd_pid"]) for h in rig["hosts"])
        out = _run_script("down", "--state", str(state))
        assert out.returncode == 0, out.stderr
        assert not netns & _netns_names() and not links & _link_names()
        assert not [h for h in rig["hosts"] if h["sshd_pid"] and _running(h["sshd_pid"])]
        assert not (state / "rig.json").exists()
    finally:
        hosts_rig.down(state)


def test_down_by_prefix_cleans_up_when_the_state_is_lost(tmp_path):
    prefix = "wbx" + secrets.token_hex(2)
    state = tmp_path / "state"
    rig = _crash_up_at("_verify", state, prefix)
    try:
        shutil.rmtree(state)
        out = _run_script("down", "--prefix", prefix)
        assert out.returncode == 0, out.stderr
        assert not [n for n in _netns_names() | _link_names() if n.startswith(prefix)]
        assert not [h for h in rig["hosts"] if _running(h["sshd_pid"])]
    finally:
        hosts_rig.down(prefix=prefix)


def test_a_failed_up_removes_what_it_built(tmp_path, monkeypatch):
    _require_rig()
    prefix = "wbf" + secrets.token_hex(2)

    def fail(*args, **kwargs):
        raise hosts_rig.RigError("injected failure")

    monkeypatch.setattr(hosts_rig.build, "_verify", fail)  # as up() finds it
    try:
        hosts_rig.up(2, tmp_path / "state", prefix=prefix)
    except hosts_rig.RigUnavailable as e:
        pytest.skip(f"multi-host rig cannot be built here: {e}")
    except hosts_rig.RigError as e:
        assert "injected failure" in str(e)
    else:
        pytest.fail("up did not raise")
    assert not [n for n in _netns_names() | _link_names() if n.startswith(prefix)]
    assert not (tmp_path / "state" / "rig.json").exists()


def test_concurrent_rigs_do_not_clash():
    _require_rig()
    rigs, errors = [], []

    def build():
        try:
            rigs.append(hosts_rig.up(1))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=build) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(T)
    try:
        unavailable = [e for e in errors if isinstance(e, hosts_rig.RigUnavailable)]
        if unavailable:
            pytest.skip(f"multi-host rig cannot be built here: {unavailable[0]}")
        assert not errors and len(rigs) == 2
        a, b = rigs
        assert a["rig_id"] != b["rig_id"] and a["subnet"] != b["subnet"]
        for rig in rigs:
            assert ssh(rig, 0, "hostname", timeout=T).stdout.strip() == rig["hosts"][0]["hostname"]
    finally:
        for rig in rigs:
            hosts_rig.down(rig["state_dir"])
    for rig in rigs:
        _assert_gone(rig)


def _pytest_in(tmp_path: Path, test_source: str, **env) -> subprocess.CompletedProcess:
    """pytest on one test file that uses the rig fixture, in a fresh process (its outcome is what is checked)."""
    (tmp_path / "test_uses_rig.py").write_text('pytest_plugins = ["rig"]\n' + textwrap.dedent(test_source))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]), **env)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-c", os.devnull,
                           "--rootdir", str(tmp_path), str(tmp_path / "test_uses_rig.py")],
                          check=False, capture_output=True, text=True, timeout=T, env=env, cwd=tmp_path)


def test_the_fixture_tears_down_after_a_failed_test(tmp_path):
    _require_rig()
    proc = _pytest_in(tmp_path, """
        import json, os
        def test_fails(multihost_rig):
            open(os.environ["RIG_OUT"], "w").write(json.dumps(multihost_rig))
            assert False, "a test that fails while the rig is up"
    """, RIG_OUT=str(tmp_path / "rig.json"))
    if "1 skipped" in proc.stdout:
        pytest.skip(proc.stdout.strip().splitlines()[-2])
    assert "1 failed" in proc.stdout, proc.stdout + proc.stderr
    _assert_gone(json.loads((tmp_path / "rig.json").read_text()))


# ------------------------------------------------------------------------------------------ no rig here


def test_a_rig_that_cannot_be_built_is_reported_as_skipped_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("WBRIG_SSHD", "/nonexistent/sshd")
    with pytest.raises(hosts_rig.RigUnavailable) as unavailable:
        hosts_rig.check_support(probe=False)
    if os.geteuid() == 0:  # not root: the reason is that instead
        assert str(unavailable.value).startswith("sshd missing: no executable /nonexistent/sshd")
    proc = _pytest_in(tmp_path, "def test_x(multihost_rig):\n    pass\n")  # WBRIG_SSHD is inherited
    assert "1 skipped" in proc.stdout and "passed" not in proc.stdout, proc.stdout + proc.stderr
    assert f"multi-host rig cannot be built here: {unavailable.value}" in proc.stdout.replace("\n", " ")


# ------------------------------------------------------------------------------------------ the package


def test_the_rig_is_a_package_imported_the_ordinary_way():
    import rig

    assert hosts_rig.__spec__.submodule_search_locations == [str(SCRIPT)]
    assert sys.modules["hosts_rig"] is hosts_rig and hosts_rig.__spec__.name == "hosts_rig"
    source = Path(rig.__file__).read_text()
    assert "spec_from_file_location" not in source and "sys.modules[" not in source


def test_the_rig_is_small_modules_split_by_meaning():
    lines = {path.name: len(path.read_text().splitlines()) for path in sorted(SCRIPT.glob("*.py"))}
    assert {"net.py", "sshd.py", "slurm.py", "procs.py", "cli.py", "__main__.py"} <= set(lines)
    assert not {name: n for name, n in lines.items() if n > 320}, lines
    assert hosts_rig.up.__module__ == "hosts_rig.build" and hosts_rig.down.__module__ == "hosts_rig.teardown"


def test_the_command_line_runs_as_a_folder_and_as_a_module(tmp_path):
    state = tmp_path / "no-rig"
    for argv, cwd in (([str(SCRIPT)], tmp_path), (["-m", "hosts_rig"], SCRIPT.parent)):
        out = subprocess.run([sys.executable, *argv, "status", "--state", str(state)], cwd=cwd,
                             check=False, capture_output=True, text=True, timeout=T)
        assert out.returncode == 1 and out.stderr.strip() == f"no rig recorded in {state}", (argv, out.stderr)
        usage = subprocess.run([sys.executable, *argv, "--help"], cwd=cwd, check=False, capture_output=True, text=True, timeout=T)
        assert usage.returncode == 0 and "{up,down,status,check}" in usage.stdout, (argv, usage.stderr)

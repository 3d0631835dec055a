"""A hosts file is read strictly (issue 24, items 1-5): every value is checked against what it may be,
and a mistake is refused naming the key or field, the host and the file, before anything starts.

One process, no network: these are the pure checks. What the launchers build from the values (the
batch script, the ssh and mpiexec command lines) is exercised in test_launcher_injection.py.
"""

from __future__ import annotations

import json
import re

import pytest

from workbench.launch.host_values import check_address, check_controller_ip
from workbench.launch.hosts import Host, HostsFile, load_hosts, parse_hosts, plan_hosts_launch
from workbench.launch.remote import Placement, controller_address

GOOD = '[[hosts]]\naddress = "10.0.0.11"\n'


def write(tmp_path, text: str, name: str = "hosts.toml"):
    path = tmp_path / name
    path.write_text(text) if isinstance(text, str) else path.write_bytes(text)
    return path


def refused(path, *parts: str) -> str:
    """The message of the error loading ``path`` raises; it must name the file and every one of ``parts``."""
    with pytest.raises(ValueError) as info:
        load_hosts(path)
    message = str(info.value)
    for part in (str(path), *parts):
        assert part in message, (part, message)
    return message


# ------------------------------------------------------------------------------------ keys and types


@pytest.mark.parametrize("text, key, near", [
    ('[[hosts]]\naddress = "10.0.0.11"\nslot = 2\n', "slot", "slots"),
    ('[[hosts]]\naddress = "10.0.0.11"\nusr = "me"\n', "usr", "user"),
    ('[[hosts]]\naddress = "10.0.0.11"\npyhton = "/opt/py/bin/python"\n', "pyhton", "python"),
    ('controler_ip = "10.0.0.1"\n' + GOOD, "controler_ip", "controller_ip"),
    ('ssh-config = "/etc/ssh/cfg"\n' + GOOD, "ssh-config", "ssh_config"),
])
def test_an_unknown_key_is_refused_naming_it_the_file_and_the_near_key(tmp_path, text, key, near):
    refused(write(tmp_path, text), f"unknown key {key!r} (did you mean {near!r}?)")


def test_every_unknown_key_of_a_host_is_named_with_the_host():
    with pytest.raises(ValueError, match=r"hosts\[1\]: unknown keys 'slot' \(did you mean 'slots'\?\), 'colour'"):
        parse_hosts({"hosts": [{"address": "10.0.0.11"}, {"address": "10.0.0.12", "slot": 2, "colour": "red"}]})


def test_the_rigs_own_bookkeeping_is_accepted_in_its_rig_json_only(tmp_path):
    host = {"name": "h1", "address": "10.0.0.11", "port": 2222, "user": "root", "python": "/usr/bin/python3",
            "hostname": "h1", "netns": "wb-h1", "veth": "wbv1", "sshd_pid": 7, "sshd_config": "/s/c",
            "sshd_log": "/s/l"}
    rig = {"rig_id": "wb", "head_address": "10.0.0.1", "ssh_config": "/s/ssh_config", "subnet": "10.0.0.0/24",
           "hosts": [host], "slurm": None, "created": 1.0}
    hf = load_hosts(write(tmp_path, json.dumps(rig), "rig.json"))
    assert hf.controller_ip == "10.0.0.1" and hf.hosts[0].name == "h1" and hf.hosts[0].port == 2222
    refused(write(tmp_path, json.dumps({k: v for k, v in rig.items() if k != "rig_id"}), "plain.json"),
            "unknown keys 'subnet', 'slurm', 'created'")


@pytest.mark.parametrize("text, parts", [
    ("controller_ip = 5\n" + GOOD, ["controller_ip=5", "must be a string"]),
    ('ssh_config = ["/etc/ssh/cfg"]\n' + GOOD, ["ssh_config=['/etc/ssh/cfg']", "must be a string", "not list"]),
    ("[[hosts]]\naddress = 10\n", ["hosts[0]", "Host.address=10", "must be a string"]),
    ('[[hosts]]\naddress = "10.0.0.11"\nuser = 0\n', ["Host.user=0", "host 10.0.0.11", "not int"]),
    ('[[hosts]]\naddress = "10.0.0.11"\nslots = "2"\n', ["Host.slots='2'", "an integer in 1..4096"]),
    ('[[hosts]]\naddress = "10.0.0.11"\nport = true\n', ["Host.port=True"]),
    ('hosts = "10.0.0.11"\n', ["needs a list 'hosts'"]),
    ('controller_ip = "10.0.0.1"\nhead_address = "10.0.0.2"\n' + GOOD, ["controller_ip='10.0.0.1'", "head_address"]),
])
def test_a_value_of_the_wrong_type_is_refused_naming_the_field_and_the_file(tmp_path, text, parts):
    refused(write(tmp_path, text), *parts)


@pytest.mark.parametrize("name, content, part", [
    ("hosts.toml", b'[[hosts]]\naddress = "10.0.0.11"\nname = "caf\xe9"\n', "not UTF-8 text"),
    ("hosts.toml", b"[[hosts]\naddress = 1\n", "cannot parse"),
    ("hosts.json", b'{"hosts": [', "cannot parse"),
    ("hosts.json", b"[" * 100_000 + b"]" * 100_000, "cannot parse"),
    ("hosts.json", b'{"hosts": [{"address": "10.0.0.11", "slots": ' + b"9" * 5000 + b"}]}", "cannot parse"),
    ("hosts.toml", b"# " + b"x" * (1 << 20) + b"\n", "too large"),
])
def test_a_file_that_does_not_read_as_a_hosts_file_is_named(tmp_path, name, content, part):
    refused(write(tmp_path, content, name), part)


def test_a_missing_file_or_a_folder_is_named(tmp_path):
    refused(tmp_path / "nowhere.toml", "no such file")
    (tmp_path / "dir.toml").mkdir()
    refused(tmp_path / "dir.toml", "not a regular file")


# ------------------------------------------------------------------------------------ values


def test_ordinary_values_are_accepted():
    hf = parse_hosts({"controller_ip": "10.0.0.1", "ssh_config": "/home/me/my cluster/ssh_config", "hosts": [
        {"address": "node-01.cluster.example", "user": "svc_ml.1", "python": "/opt/venvs/py3.11+cu12/bin/python3",
         "name": "gpu-01"},
        {"address": "10.0.0.12", "user": "machine$", "python": "python3"}]})
    assert [h.name for h in hf.hosts] == ["gpu-01", "10.0.0.12"] and hf.ssh_config == "/home/me/my cluster/ssh_config"


PAYLOADS = [  # (field, value, what the error says): the probes of issue 24 and their kin
    ("address", "{__import__('os').system('touch pwned')}", "contains '{' or '}'"),
    ("name", "{__import__('os').system('touch pwned')}", "contains '{' or '}'"),
    ("name", "h1\ntouch pwned", "control character"),
    ("name", "h1\r#", "control character"),
    ("user", "-oProxyCommand=touch pwned;", "whitespace"),
    ("user", "-oProxyCommand=reboot", "starts with '-'"),
    ("user", "me -oProxyCommand=x", "whitespace"),
    ("user", "me@other", "is not a user name"),
    ("user", "DOMAIN\\me", "is not a user name"),
    ("python", "python3; touch pwned", "whitespace"),
    ("python", "python3;touch${IFS}pwned", "contains '{' or '}'"),
    ("python", "python3;reboot", "is not the path of the Python"),
    ("python", "$(reboot)", "is not the path of the Python"),
    ("python", "`reboot`", "is not the path of the Python"),
    ("python", "~/venv/bin/python", "no '~'"),
    ("python", "LD_PRELOAD=/tmp/x.so", "is not the path of the Python"),  # an assignment word to the login shell
    ("python", "%PATH%", "is not the path of the Python"),
    ("python", "-c", "starts with '-'"),
    ("python", "", "is empty"),
    ("address", "-oProxyCommand=x", "starts with '-'"),
    ("address", "node 1", "whitespace"),
    ("address", "node1;reboot", "is not an IPv4 address or a host name"),
    ("address", "10.0.0.11\n", "control character"),
]


@pytest.mark.parametrize("field, value, why", PAYLOADS)
def test_a_host_value_that_could_run_or_add_anything_is_refused_naming_field_host_and_file(tmp_path, field, value, why):
    host = {"address": "10.0.0.11", field: value}
    path = write(tmp_path, json.dumps({"hosts": [{"address": "10.0.0.10"}, host]}), "hosts.json")
    message = refused(path, "hosts[1]", f"Host.{field}={value!r}", why)
    if field != "address":
        assert "(host 10.0.0.11)" in message
    with pytest.raises(ValueError, match=re.escape(why)):  # a Host built in code is checked the same way
        Host(**host)


@pytest.mark.parametrize("field, value, why", [
    ("ssh_config", "/etc/ssh/{cfg}", "contains '{' or '}'"),
    ("ssh_config", "/etc/ssh/cfg\nProxyCommand x", "control character"),
    ("ssh_config", "-oProxyCommand=x", "starts with '-'"),
    ("controller_ip", "10.0.0.1\n", "control character"),
])
def test_a_file_wide_value_is_refused_naming_it_and_the_file(tmp_path, field, value, why):
    refused(write(tmp_path, json.dumps({field: value, "hosts": [{"address": "10.0.0.11"}]}), "hosts.json"),
            f"{field}={value!r}", why)


def test_an_ssh_config_with_a_space_is_refused_for_mpi_before_anything_runs(tmp_path):
    path = write(tmp_path, 'ssh_config = "/home/me/my cluster/ssh_config"\n' + GOOD)
    assert Placement.of(path, "ssh").runner() is not None  # ssh takes it as one argument
    with pytest.raises(ValueError, match=rf"hosts file {re.escape(str(path))}: ssh_config='/home/me/my cluster/"
                                         r"ssh_config': launcher='mpi' .* splits on whitespace"):
        Placement.of(path, "mpi")


# ------------------------------------------------------------------------------------ addresses

WILDCARD_OR_LOOPBACK = ["*", "0", "0.0.0.0", "::", "0:0:0:0:0:0:0:0", "::ffff:0.0.0.0", "localhost", "LocalHost.",
                        "127.0.0.1", "127.1", "0x7f000001", "2130706433", "::1", "::ffff:127.0.0.1", "0.1.2.3",
                        "224.0.0.1", "255.255.255.255"]


@pytest.mark.parametrize("spelling", WILDCARD_OR_LOOPBACK)
def test_every_wildcard_or_loopback_spelling_is_refused_for_the_controller_naming_the_field(tmp_path, spelling):
    hosts = HostsFile(hosts=(Host(address="10.0.0.11"),))
    with pytest.raises(ValueError, match=rf"^controller_ip={re.escape(repr(spelling))}: .*(wildcard|loopback)"):
        controller_address(hosts, spelling)  # as start_remote_engines is given it
    refused(write(tmp_path, json.dumps({"controller_ip": spelling, "hosts": [{"address": "10.0.0.11"}]}), "h.json"),
            f"controller_ip={spelling!r}")
    with pytest.raises(ValueError, match=r"Host.address=.*(wildcard|loopback)"):
        Host(address=spelling)


@pytest.mark.parametrize("value, why", [("eth0", "not a name, '\\*' or an interface"),
                                        ("head.example", "not a name"), ("10.0.0.1 ", "whitespace")])
def test_the_controller_address_must_be_an_address_it_can_bind(value, why):
    with pytest.raises(ValueError, match=why):
        check_controller_ip(value)


def test_the_controller_address_is_normalised():
    assert check_controller_ip("10.0.0.1") == "10.0.0.1"
    assert HostsFile(hosts=(Host(address="10.0.0.11"),), controller_ip="10.0.0.1").controller_ip == "10.0.0.1"


@pytest.mark.parametrize("address, hint", [("fd00::11", ""), ("fe80::1%eth0", ""),
                                           ("::ffff:10.0.0.11", " (10.0.0.11)"), ("2001:db8::1", "")])
def test_an_ipv6_host_address_is_refused_naming_host_and_file(tmp_path, address, hint):
    path = write(tmp_path, json.dumps({"hosts": [{"address": "10.0.0.10"}, {"address": address}]}), "hosts.json")
    message = refused(path, "hosts[1]", f"Host.address={address!r}", "IPv6 addresses are not supported")
    assert f"give the IPv4 address{hint} or a name" in message
    with pytest.raises(ValueError, match="IPv6"):
        check_controller_ip(address)


def test_an_address_is_an_ipv4_address_or_a_name():
    assert check_address("10.0.0.11") == "10.0.0.11" and check_address("node-1.example") == "node-1.example"
    with pytest.raises(ValueError, match=r"dotted form \(10.0.0.11\)"):
        check_address("10.11")  # inet_aton reads it as 10.0.0.11: the file says what it means


def test_an_ssh_config_someone_else_could_write_is_refused_before_ssh_reads_it(tmp_path):
    """ssh obeys ProxyCommand, LocalCommand and Match exec in a -F file and checks nothing of it, so a
    hosts file's ssh_config must be as private as ssh demands of ~/.ssh/config (found in review)."""
    from workbench.launch.host_values import check_ssh_config_file
    from workbench.launch.remote import start_remote_engines

    config = tmp_path / "cfg"
    config.write_text(f"Host *\n  ProxyCommand touch {tmp_path / 'pwned'}\n")
    config.chmod(0o666)
    with pytest.raises(ValueError, match=r"^ssh_config='.*cfg': owned by uid \d+ with mode -rw-rw-rw-; ssh runs the "
                                         r"commands a config names"):
        check_ssh_config_file(str(config))
    plan = plan_hosts_launch(HostsFile(hosts=(Host(address="10.0.0.11"), Host(address="10.0.0.12"))), framework="jax")
    with pytest.raises(ValueError, match=r"^ssh_config=.*writable by no one else"):  # before any controller or ssh
        with start_remote_engines(plan, launcher="ssh", controller_ip="10.0.0.1", ssh_config=str(config),
                                  timeout_s=5, workdir=tmp_path / "work"):
            pass
    assert not (tmp_path / "pwned").exists()
    config.chmod(0o600)
    assert check_ssh_config_file(str(config)) == str(config)
    for bad, why in ((tmp_path, "not a regular file"), (tmp_path / "none", "cannot be read")):
        with pytest.raises(ValueError, match=why):
            check_ssh_config_file(str(bad))

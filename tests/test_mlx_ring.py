"""Joining MLX's ring without its one-second retry (workbench.adapters.mlx.ring), in one process: which rank waits
for which addresses, the kernel's table of listeners read back, and the wait bounded. Every MLX run of the suite
joins through it (test_mlx_fsdp, test_collectives, ...)."""

import socket
import time

import pytest

from workbench.adapters.mlx.ring import addresses_to_wait_for, init_ring, peers_to_wait_for
from workbench.core.listeners import listening_ports, loopback, wait_for_listeners


@pytest.fixture
def listener():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield s.getsockname()


def test_only_the_last_rank_waits_and_only_for_the_other_ranks_on_loopback():
    hosts = [["127.0.0.1:5001"], ["127.0.0.1:5002"], ["127.0.0.1:5003"]]
    assert peers_to_wait_for(hosts, 2) == [("127.0.0.1", 5001), ("127.0.0.1", 5002)]
    assert peers_to_wait_for(hosts, 0) == peers_to_wait_for(hosts, 1) == []  # they listen first
    assert peers_to_wait_for([["127.0.0.1:5001"]], 0) == []  # a ring of one
    # another machine's listener is not in this one's table; a name or IPv6 is not read: MLX joins as it would
    for other in ("10.0.0.2:5001", "node1:5001", "[::1]:5001"):
        assert peers_to_wait_for([[other], ["127.0.0.1:5002"]], 1) == [] and loopback(other) is None, other
    assert loopback("127.0.0.1:7000") == ("127.0.0.1", 7000)  # JAX's coordinator: a rank other than 0 waits for it


def test_the_kernels_table_shows_a_listener_and_the_wait_ends_when_it_listens(listener, tmp_path):
    assert listener in listening_ports()
    assert wait_for_listeners([listener], timeout_s=5.0) < 1.0
    table = tmp_path / "tcp"  # the kernel's format: local address as little-endian hex, state 0A = listening
    table.write_text("  sl  local_address rem_address   st\n"
                     "   0: 0100007F:1F90 00000000:0000 0A\n   1: 0100007F:1F91 0100007F:9C40 01\n")
    six = tmp_path / "tcp6"  # JAX's coordinator (gRPC): an IPv6 socket on the IPv4-mapped ::ffff:127.0.0.1
    six.write_text("  sl  local_address remote_address st\n"
                   "   0: 0000000000000000FFFF00000100007F:B26E 00000000000000000000000000000000:0000 0A\n"
                   "   1: 00000000000000000000000000000000:0016 00000000000000000000000000000000:0000 0A\n")
    assert listening_ports((table, six, tmp_path / "missing")) == {("127.0.0.1", 8080), ("127.0.0.1", 45678),
                                                                   ("::", 22)}


def test_a_rank_that_never_listens_bounds_the_wait():
    with socket.socket() as s:  # a port bound but not listening: nothing in the table answers it
        s.bind(("127.0.0.1", 0))
        waited = wait_for_listeners([s.getsockname()], timeout_s=0.05)
    assert 0.05 <= waited < 1.0


def test_a_ring_joined_already_waits_for_no_one(tmp_path):
    """An engine kept for the next run holds its group (MLX's init returns it) and its peers listen no more: a wait
    there would last its whole bound before every pooled run."""
    hostfile = tmp_path / "hostfile.json"
    hostfile.write_text('[["127.0.0.1:5001"], ["127.0.0.1:5002"]]')
    environ = {"MLX_HOSTFILE": str(hostfile), "MLX_RANK": "1"}
    assert addresses_to_wait_for("ring", environ, joined=set()) == [("127.0.0.1", 5001)]
    assert addresses_to_wait_for("ring", environ, joined={"ring"}) == []
    assert addresses_to_wait_for("mpi", environ, joined=set()) == []
    assert addresses_to_wait_for("ring", {**environ, "MLX_RANK": "x"}, joined=set()) == []


def test_a_hostfile_that_cannot_be_read_joins_at_once(tmp_path):
    bad = tmp_path / "hostfile.json"
    bad.write_text("{not json")
    start = time.monotonic()
    with pytest.raises(RuntimeError):  # MLX's own error for a ring it cannot join (no hostfile in this process)
        init_ring("ring", {"MLX_HOSTFILE": str(bad), "MLX_RANK": "1"})
    assert time.monotonic() - start < 0.5

"""Wait for a peer on this machine to listen before connecting to it, without sending it anything.

MLX's ring and JAX's coordination client both retry a connect that found no listener only after a second's
sleep (MLX: ``CONN_WAIT`` of 1000 ms, doubled on each retry; JAX's client: about 1 s). A run's ranks start a
few milliseconds apart on their engines, so a rank that connected first slept a second in most runs:
:mod:`workbench.adapters.mlx.ring` and :func:`workbench.adapters.jax.distributed.initialize_jax` wait here
first. The listeners are read from the kernel's socket tables (``/proc/net/tcp``, ``tcp6``), which shows this machine's
(this network namespace's) sockets only, so a wait is asked only for loopback addresses (:func:`loopback`), and
it is bounded (:data:`WAIT_S`): after it, the connect goes ahead with its own retries, as it would have. A
probing connect is never made: MLX's rank 0 would take it for its neighbour.
"""

from __future__ import annotations

import ipaddress
import time
from pathlib import Path

#: The longest wait for a listener: the connect's own first retry comes after about 1 s.
WAIT_S = 1.0
#: How often the socket table is read while waiting.
POLL_S = 0.002
#: The kernel's socket tables read: IPv4's and IPv6's.
TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
#: The socket tables' state of a listening socket.
LISTEN = "0A"


def listening_ports(tables: tuple[str | Path, ...] = TABLES) -> set[tuple[str, int]]:
    """The ``(ip, port)`` of every socket listening in ``tables`` (the kernel's format: IPv4's, and IPv6's whose
    IPv4-mapped addresses are read as IPv4, as gRPC's listener for JAX's coordinator is); a table that cannot be
    read adds none."""
    found = set()
    for table in tables:
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == LISTEN:
                address, port = fields[1].split(":")
                found.add((_ip(address), int(port, 16)))
    return found


def _ip(hex_address: str) -> str:
    """An address of the socket table (4-byte words, each in this machine's order, little-endian here) as text."""
    raw = b"".join(int(hex_address[i:i + 8], 16).to_bytes(4, "little") for i in range(0, len(hex_address), 8))
    ip = ipaddress.ip_address(raw)
    mapped = getattr(ip, "ipv4_mapped", None)
    return str(mapped or ip)


def _all_listen(wanted: list[tuple[str, int]], listeners: set[tuple[str, int]]) -> bool:
    """Whether every address of ``wanted`` is served by one of ``listeners``: its own address, or every address
    (0.0.0.0, ::) on its port."""
    return all(any(port == w_port and ip in (w_ip, "0.0.0.0", "::") for ip, port in listeners)
               for w_ip, w_port in wanted)


def loopback(address: str) -> tuple[str, int] | None:
    """``"ip:port"`` as ``(ip, port)`` where ``ip`` is an IPv4 loopback address; None for any other address (a
    name, IPv6, another machine's), whose listener this machine's table would not show."""
    ip, _, port = str(address).rpartition(":")
    try:
        return (ip, int(port)) if ipaddress.IPv4Address(ip).is_loopback else None
    except ValueError:
        return None


def wait_for_listeners(wanted: list[tuple[str, int]], timeout_s: float = WAIT_S) -> float:
    """Wait until every address of ``wanted`` is listening on this machine, at most ``timeout_s``; returns the
    seconds waited."""
    start = time.monotonic()
    while wanted and not _all_listen(wanted, listening_ports()):  # the tables read once a poll, for every address
        if time.monotonic() - start >= timeout_s:
            break
        time.sleep(POLL_S)
    return time.monotonic() - start

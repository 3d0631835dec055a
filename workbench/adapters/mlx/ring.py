"""Join MLX's ring without its one-second retry (a run's ranks, its collective benchmark, its step timing).

MLX's ring (``mlx/distributed/ring/ring.cpp``, MLX 0.32) joins in one fixed order: every rank but the last
listens for its left neighbour first, then connects to its right one; the last rank connects to rank 0 first,
then listens. A connect that finds no listener sleeps 1 s before its next try. The engines of a run start
their ranks a few milliseconds apart, so the last rank often connected before rank 0 listened, or a rank
before its right neighbour did: joining 4 ranks started at once took 1.0-1.1 s in most tries here, against
40-120 ms where no connect failed (a run of 2 on its engines: 1.0 s against 31 ms).

So the last rank waits, before it joins, until every other rank's address is listening (they all listen as they
join), and only there: after its connect, each rank's right neighbour is listening already, so no connect of
the chain fails. The wait is :func:`workbench.core.listeners.wait_for_listeners`: bounded, and only where every
other rank is on a loopback address. An engine kept for the next run (:mod:`workbench.launch.pool`) holds the
group it joined, which MLX's ``init`` returns: nothing listens then, and no rank waits.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from workbench.core.listeners import loopback, wait_for_listeners

_joined: set[str] = set()  # the backends this process joined (MLX keeps the group: a later init returns it)


def peers_to_wait_for(hosts: list, rank: int) -> list[tuple[str, int]]:
    """The addresses ``rank`` waits for, from MLX's ring hostfile ``hosts`` (one list of ``"ip:port"`` per rank):
    every other rank's for the last rank; none for any other rank, a ring of one, or where an address is not
    IPv4 loopback."""
    if rank != len(hosts) - 1 or len(hosts) < 2:
        return []
    wanted = [loopback(address) for addresses in hosts[:-1] for address in addresses]
    return [] if None in wanted else wanted


def addresses_to_wait_for(backend: str, environ: dict, joined: set[str]) -> list[tuple[str, int]]:
    """What this process waits for before it joins ``backend``: :func:`peers_to_wait_for` of the hostfile and rank
    in ``environ`` (``MLX_HOSTFILE``, ``MLX_RANK``) for a ring not yet ``joined`` here; none for another backend,
    a ring this process joined already (a kept engine's group, which MLX's ``init`` returns: no one listens any
    more), or a hostfile or rank that cannot be read (MLX then says what is wrong)."""
    if backend != "ring" or backend in joined:
        return []
    try:
        return peers_to_wait_for(json.loads(Path(environ["MLX_HOSTFILE"]).read_text()), int(environ["MLX_RANK"]))
    except (KeyError, OSError, ValueError, TypeError):
        return []


def init_ring(backend: str = "ring", environ: dict | None = None) -> Any:
    """``mx.distributed.init(backend=backend, strict=True)``, the ring's last rank first waiting for the others to
    listen (module docstring, :func:`addresses_to_wait_for`)."""
    import mlx.core as mx

    wait_for_listeners(addresses_to_wait_for(backend, os.environ if environ is None else environ, _joined))
    group = mx.distributed.init(backend=backend, strict=True)
    _joined.add(backend)
    return group

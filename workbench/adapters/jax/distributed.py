"""JAX across processes: ``jax.distributed`` on the coordinator's interface, CPU collectives over gloo.

Every rank program that runs JAX over several processes starts here
(:func:`initialize_jax`); the launch plan names each rank's gloo address in
:data:`GLOO_HOST_ENV` (:func:`workbench.launch.hosts.plan_hosts_launch`). JAX itself is imported
only inside the functions, so the launcher can read the variable's name without loading JAX.
"""

from __future__ import annotations

import functools
import os
from typing import Callable

#: The address this rank's gloo listens on, where it is not the coordinator's host (another host).
GLOO_HOST_ENV = "WORKBENCH_GLOO_HOST"
#: The CPU collectives :func:`initialize_jax` sets up: gloo, or JAX's default (none across processes on CPU).
BACKENDS = ("gloo", "default")


def bind_gloo_to(host: str) -> bool:
    """Make gloo listen on ``host`` only; returns whether the hook was installed.

    JAX 0.10 has no option for gloo's address: ``xla_bridge`` calls
    ``make_gloo_tcp_collectives(distributed_client=...)`` without ``hostname``, and gloo
    then listens on whatever this machine's hostname resolves to (possibly a public
    interface). This wraps that private factory to pass ``hostname=host``; if a later JAX
    moves it (or the private module itself), nothing is patched, gloo keeps its default,
    and this returns False.

    Args:
        host: The address gloo listens on (an IP address or a resolvable name).
    """
    try:
        from jax._src import xla_bridge

        make = getattr(xla_bridge._jax, "make_gloo_tcp_collectives", None)
    except (ImportError, AttributeError):
        return False
    if make is None or isinstance(make, functools.partial):
        return make is not None
    xla_bridge._jax.make_gloo_tcp_collectives = functools.partial(make, hostname=host)
    return True


def initialize_jax(coordinator: str, num_processes: int, process_id: int, *, backend: str = "gloo",
                   timeout_s: int = 60) -> bool:
    """``jax.distributed.initialize`` with the coordinator listening on its own interface only, and JAX's
    persistent compilation cache on (:func:`~workbench.adapters.jax.compile_cache.enable_compile_cache`).

    With gloo, CPU collectives go over gloo bound to this rank's host: ``$WORKBENCH_GLOO_HOST``
    (:data:`GLOO_HOST_ENV`, set per rank by a multi-host plan), else the coordinator's host. A process other than
    0 whose coordinator is on this machine's loopback first waits (1 s at most) for it to listen: JAX's client,
    connecting before, retried only after about a second (:mod:`workbench.core.listeners`).

    Args:
        coordinator: ``host:port`` of process 0's coordinator.
        num_processes: Processes in the world.
        process_id: This process's rank, 0 to ``num_processes - 1``.
        backend: One of :data:`BACKENDS` (anything but ``"gloo"`` leaves JAX's default).
        timeout_s: Seconds to wait for every process to join.

    Returns:
        Whether gloo was bound to the host (see :func:`bind_gloo_to`).
    """
    import jax

    from workbench.adapters.jax.compile_cache import enable_compile_cache
    from workbench.core.listeners import loopback, wait_for_listeners

    enable_compile_cache()  # before the first compile: the step compiled once on this machine is read back
    coordinator_here = loopback(coordinator)
    if process_id != 0 and coordinator_here is not None:  # not before it listens: JAX's client retries after ~1 s
        wait_for_listeners([coordinator_here])
    gloo_bound = False
    if backend == "gloo":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        gloo_bound = bind_gloo_to(os.environ.get(GLOO_HOST_ENV) or coordinator.rsplit(":", 1)[0])
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id,
                               coordinator_bind_address=coordinator,  # listen on the coordinator's interface only
                               initialization_timeout=timeout_s)
    return gloo_bound


def devices_by_process():
    """Every device of the run as a NumPy array, ordered by process (then id): mesh position r is process r's."""
    import jax
    import numpy as np

    return np.array(sorted(jax.devices(), key=lambda d: (d.process_index, d.id)))


def process_mesh(num_replicas: int = 1):
    """Every device, ordered by process, as the run's mesh: ``("fsdp",)``, or under HSDP ``("replica", "fsdp")`` of
    shape ``(R, N / R)``, so that each replica group is ``N / R`` consecutive processes (a host's, as a launch places
    ranks host by host). Either way a batch sharded over all the mesh's axes gives process r the rows
    ``rank_slice(batch, r, N)``. Returns ``(mesh, data_axes)``: the axes to shard a batch's rows over."""
    from jax.sharding import Mesh

    devices = devices_by_process()
    if num_replicas == 1:
        return Mesh(devices, ("fsdp",)), ("fsdp",)
    if len(devices) % num_replicas:
        raise ValueError(f"num_replicas={num_replicas}: does not divide the {len(devices)} devices into replica groups")
    return Mesh(devices.reshape(num_replicas, -1), ("replica", "fsdp")), ("replica", "fsdp")


def ranks_barrier(size: int) -> Callable[[], None]:
    """A barrier of the ``size`` ranks (``multihost_utils.sync_global_devices``), its small program compiled here,
    so that calling it adds nothing to a measured peak. The ranks meet before the step whose peak is read, and
    start it together as the timed steps do (each follows the last one's collectives). Without it, a rank whose
    heap took less long to release started ahead of its peer, and ZeRO-3's rank 1 on the validation LM held more
    beside the compiled step (gloo's): 1.14-1.32 of XLA's plan over 11 runs alone (1.39 once in CI), where rank 0
    read 1.14; with it, 1.14-1.17 in 16 runs alone, and 1.21-1.29 in three runs of the test suites."""
    from jax.experimental import multihost_utils

    if size == 1:
        return lambda: None
    multihost_utils.sync_global_devices("before the measured step (compiled)")
    return lambda: multihost_utils.sync_global_devices("before the measured step")

"""A multi-host rig on one machine: each "host" is a Linux network namespace with its own sshd.

    python scripts/hosts_rig check                    # can the rig be built here? (exit 0, or 2 and why not)
    python scripts/hosts_rig up --hosts 2 [--state DIR] [--slurm] [--foreground]
    python scripts/hosts_rig down --state DIR         # or: down --prefix wbrig (every rig of that prefix)

(``python -m hosts_rig ...`` with ``scripts/`` on the path; tests import it through tests/rig.py.)

What ``up`` builds (all of it is torn down by ``down``):

* a bridge in the root namespace holding the rig's first address (198.18.0.1 in 198.18.0.0/24 unless
  that /24 is taken or ``--subnet`` says otherwise): the root namespace is the "head" that reaches
  every host, and where a controller would listen;
* per host a namespace, a veth pair (the root side enslaved to the bridge, the other side ``eth0`` in
  the namespace) and one address (.11, .12, ...). Hosts get no default route: the rig's subnet is all
  they can reach, and nothing is routed off the machine;
* per host an ``sshd`` listening only on that host's address, inside the namespace, with its own
  host key and, by default, its own hostname (a UTS namespace) that every host resolves
  (``/etc/netns/<namespace>/hosts``, which ``ip netns exec`` mounts over ``/etc/hosts``);
* an ed25519 client key, ``known_hosts`` and an ssh config, so ``ssh -F <state>/ssh_config <address>``
  (or ``<state>/bin/ssh <address>``) logs in non-interactively (BatchMode, host keys checked);
* with ``--slurm``, a Slurm cluster (Debian's slurm-wlm and munge), all of it under
  ``<state>/<rig id>-slurm/``: a ``munged`` with a key generated for the rig and its socket there, a
  ``slurmctld`` on the head (in a UTS and mount namespace of its own, named ``<rig id>-head`` and
  listening only on the head's address) and one ``slurmd`` per host, inside the host's namespace, whose
  Slurm node name is the host's name (``h1``, ``h2``, ...), all in one partition ``rig``. Client
  commands find it by ``SLURM_CONF=<state>/<rig id>-slurm/slurm.conf`` (``slurm.env`` in the
  description); ``up`` returns once every node is idle.

The namespaces share the filesystem, so a host runs the repository's own Python. ``up`` prints the
rig's description (also written to ``<state>/rig.json``): addresses, ssh port, user, python, key,
ssh config. Names start with a prefix (``wbrig``) and a random id, and each rig takes a free /24,
so concurrent rigs do not clash. ``up`` records its plan before it builds anything, so ``down
--state`` cleans up after an ``up`` that crashed; ``down --prefix`` cleans up by name when even the
state is lost. ``down`` kills every process inside the rig's namespaces (sshd, sessions, engines),
removes namespaces, veths and bridge, checks that nothing is left, and is idempotent.

Needs Linux, root, iproute2 and Debian's openssh-server (``up --install-sshd`` installs it); ``--slurm``
also needs ``slurm-wlm`` and ``munge``. Every command it runs has a timeout.

Modules, each importing only those above it: ``errors``; ``procs`` (commands with timeouts, processes
found and ended); ``state`` (rig.json, the lock); ``net`` (namespaces, veths, bridge, addresses);
``sshd`` (an sshd per host, keys, ssh_config, ssh to a host); ``slurm`` (munged, slurmctld, slurmd);
``teardown`` (``down``); ``build`` (``up``); ``cli`` (the command line, also ``__main__``).
"""

from __future__ import annotations

from .build import MAX_HOSTS, check_support, up
from .errors import RigError, RigUnavailable, SlurmUnavailable
from .net import DEFAULT_PREFIX, _pids_in_netns
from .procs import _alive, _cmdline
from .slurm import check_slurm_support
from .sshd import _is_sshd, find_host, install_sshd, ssh, ssh_argv
from .state import DEFAULT_BASE, STATE_FILE, load
from .teardown import down, leftovers

__all__ = ["DEFAULT_BASE", "DEFAULT_PREFIX", "MAX_HOSTS", "STATE_FILE", "RigError", "RigUnavailable", "SlurmUnavailable",
           "check_slurm_support", "check_support", "down", "find_host", "install_sshd", "leftovers", "load", "ssh",
           "ssh_argv", "up"]
# Also here for tests/test_multihost.py, which lists what runs left on a host: _alive, _cmdline, _is_sshd, _pids_in_netns.

"""The command line of a JAX rank program: where it stands in the world, from flags or the launcher's variables.

:func:`workbench.launch.plan.plan_launch` sets each rank's ``WORKBENCH_COORDINATOR``,
``WORKBENCH_NUM_PROCESSES``, ``WORKBENCH_PROCESS_ID`` and ``WORKBENCH_BACKEND``, so every rank of a
run gets the same argv; by hand, one command per process, the flags say it instead (a flag given
overrides its variable). The program then calls
:func:`~workbench.adapters.jax.distributed.initialize_jax` with what this returns.
"""

from __future__ import annotations

import argparse
import os

from workbench.adapters.jax.distributed import BACKENDS

#: Flag -> the environment variable (set by :func:`workbench.launch.plan.plan_launch`) read when it is absent.
ENV = {"coordinator": "WORKBENCH_COORDINATOR", "num_processes": "WORKBENCH_NUM_PROCESSES",
       "process_id": "WORKBENCH_PROCESS_ID", "backend": "WORKBENCH_BACKEND"}


def parse_rank_args(argv: list[str] | None = None, environ: dict[str, str] | None = None, *,
                    parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """A JAX rank program's arguments; each flag of :data:`ENV` that is absent is read from its variable.

    Adds ``--coordinator``, ``--num-processes``, ``--process-id``, ``--backend`` (default ``gloo``),
    ``--out`` (required; ``{process_id}`` in it becomes the process id) and ``--timeout-s``
    (distributed initialisation, seconds, default 60) to ``parser``, the program's own with its own
    flags, or a new one.

    Args:
        argv: The arguments (default ``sys.argv[1:]``).
        environ: The variables of :data:`ENV` (default ``os.environ``).
        parser: The program's parser.

    Exits with status 2 (``argparse``'s), naming the flag and the variable, when neither is
    given or the variable's value is malformed.
    """
    environ = os.environ if environ is None else environ
    parser = parser or argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--coordinator", help="host:port of process 0's coordinator, e.g. 127.0.0.1:1234")
    parser.add_argument("--num-processes", type=int)
    parser.add_argument("--process-id", type=int)
    parser.add_argument("--backend", choices=BACKENDS, help="CPU collectives (default: gloo)")
    parser.add_argument("--out", required=True, help="where to write; '{process_id}' is replaced by the rank")
    parser.add_argument("--timeout-s", type=int, default=60, help="distributed initialisation timeout")
    args = parser.parse_args(argv)
    for name, var in ENV.items():
        flag, value = "--" + name.replace("_", "-"), environ.get(var) or ("gloo" if name == "backend" else "")
        if getattr(args, name) is not None:
            continue
        if not value:
            parser.error(f"{flag} is required when {var} is not set.")
        if name in ("num_processes", "process_id") and not value.isdigit():
            parser.error(f"{flag} is not given and {var}={value!r} is not a non-negative integer.")
        if name == "backend" and value not in BACKENDS:
            parser.error(f"{flag} is not given and {var}={value!r} is not one of {BACKENDS}.")
        setattr(args, name, int(value) if name in ("num_processes", "process_id") else value)
    args.out = args.out.replace("{process_id}", str(args.process_id))
    return args

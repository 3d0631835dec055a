"""A multi-host rig on one machine: each "host" is a Linux network namespace with its own sshd.

    python scripts/hosts_rig check                    # can the rig be built here? (exit 0, or 2 and why not)
    python scripts/hosts_rig up --hosts 2 [--state DIR] [--slurm] [--foreground]
    python scripts/hosts_rig down --state DIR         # or: down --prefix wbrig (every rig of that prefix)

(or ``python -m hosts_rig ...`` with ``scripts/`` on the path.) What it builds: the package's docstring.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import signal
import sys
import time

from .build import check_support, up
from .errors import RigError, RigUnavailable
from .net import DEFAULT_PREFIX
from .sshd import install_sshd
from .state import load
from .teardown import _quiet_down, down, leftovers

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="build a rig and print its description (JSON)")
    p_up.add_argument("--hosts", type=int, default=2, help="number of hosts (default 2)")
    p_up.add_argument("--state", help="state directory (default /run/wbrig/<rig id>)")
    p_up.add_argument("--prefix", default=DEFAULT_PREFIX, help="name prefix of namespaces, links and rig id (default wbrig)")
    p_up.add_argument("--subnet", help="IPv4 subnet, e.g. 198.18.0.0/24 (default: the first free /24 of 198.18.0.0/15)")
    p_up.add_argument("--port", type=int, default=22, help="sshd port on each host (default 22)")
    p_up.add_argument("--python", default=None, help="the python the hosts run (default: this one)")
    p_up.add_argument("--no-uts", action="store_true", help="hosts keep this machine's hostname")
    p_up.add_argument("--no-verify", action="store_true", help="skip the ssh + python + host-to-host check")
    p_up.add_argument("--install-sshd", action="store_true", help="apt-get install openssh-server if sshd is missing")
    p_up.add_argument("--slurm", action="store_true", help="also a Slurm cluster: munged, slurmctld on the head, a slurmd "
                      "per host (needs slurm-wlm and munge); clients use SLURM_CONF=<the description's slurm.conf>")
    p_up.add_argument("--foreground", action="store_true", help="stay running and tear down on exit (Ctrl-C, SIGTERM)")
    p_up.add_argument("--timeout", type=float, default=30.0, help="seconds for sshd to come up and answer (default 30)")
    p_down = sub.add_parser("down", help="tear a rig down (idempotent)")
    p_down.add_argument("--state", help="the rig recorded in this state directory")
    p_down.add_argument("--prefix", help="every rig whose names start with this prefix (by name, even without state)")
    p_down.add_argument("--keep-state", action="store_true", help="keep the state directory (logs, keys)")
    p_status = sub.add_parser("status", help="print a rig's description and what of it exists")
    p_status.add_argument("--state", required=True)
    sub.add_parser("check", help="exit 0 if the rig can be built here, else 2 and the reason")
    args = ap.parse_args(argv)

    try:
        if args.cmd == "check":
            check_support()
            print("ok: the multi-host rig can be built here")
            return 0
        if args.cmd == "status":
            desc = load(args.state)
            if desc is None:
                print(f"no rig recorded in {args.state}", file=sys.stderr)
                return 1
            print(json.dumps(dict(desc, exists=leftovers(desc)), indent=2))
            return 0
        if args.cmd == "down":
            if args.state is None and args.prefix is None:
                ap.error("down needs --state DIR or --prefix PREFIX")
            removed = down(args.state, prefix=args.prefix, keep_state=args.keep_state)
            print("removed: " + (", ".join(removed) if removed else "nothing (no such rig)"))
            return 0
        if args.install_sshd:
            install_sshd()
        t0 = time.perf_counter()
        desc = up(args.hosts, args.state, prefix=args.prefix, subnet=args.subnet, port=args.port,
                  python=args.python, uts=not args.no_uts, verify=not args.no_verify, timeout=args.timeout,
                  slurm=args.slurm)
        if args.foreground:
            atexit.register(_quiet_down, desc)
        print(json.dumps(desc, indent=2), flush=True)
        print(f"rig {desc['rig_id']} up in {time.perf_counter() - t0:.2f} s: {len(desc['hosts'])} hosts in {desc['subnet']}; "
              f"ssh -F {desc['ssh_config']} {desc['hosts'][0]['address']}"
              + (f"; Slurm: export SLURM_CONF={desc['slurm']['conf']}; sinfo" if desc.get("slurm") else "") + "; "
              + ("Ctrl-C to tear down" if args.foreground else f"tear down: {sys.argv[0]} down --state {desc['state_dir']}"),
              file=sys.stderr, flush=True)
        if args.foreground:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGINT too: ignored by default in background jobs
                signal.signal(sig, lambda *_: sys.exit(0))
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    signal.pause()
        return 0
    except RigUnavailable as e:
        print(f"the multi-host rig cannot be built here: {e}", file=sys.stderr)
        return 2
    except RigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1

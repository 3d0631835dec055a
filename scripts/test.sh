#!/usr/bin/env bash
# Installs what the tests need on a fresh machine (Python 3.11; Debian packages where this runs as
# root with apt; Python packages at the versions constraints.txt pins, the ones CI tested) and runs
# every test. The README's test command; CI (.ci/run) runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
# need COMMAND "DEBIAN PACKAGES" WHAT: installs the packages if COMMAND is missing and this runs as root
# with apt; otherwise says which tests will be skipped.
need() {
  if ! command -v "$1" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$1" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      # A failed apt (no mirror reachable) must not end the script under set -e: the tests still run.
      if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $2 >/dev/null; }; then
        echo "note: apt-get could not install $2; the $3 tests will be skipped"
      fi
    else
      echo "note: $1 not found and Debian packages cannot be installed here; the $3 tests will be skipped"
    fi
  fi
}
# OpenMPI: MLX's MPI backend is the CPU backend that can split groups (HSDP).
need mpirun "openmpi-bin libopenmpi-dev" "MPI (HSDP)"
# Chromium (Debian's): the browser tests drive it through playwright (never `playwright install`, whose
# browser download is not a package), and kaleido renders static figures with it.
need chromium chromium browser
# openssh-server: each host of the multi-host rig runs its own sshd (tests/test_hosts_rig.py).
need sshd openssh-server "multi-host rig"
# Slurm and munge: the rig's own Slurm cluster (scripts/hosts_rig up --slurm) for ipyparallel's Slurm launcher.
need slurmctld "slurm-wlm munge" "Slurm"
python3 -m pip install -q -c constraints.txt -e ".[all,test]"
# Three workers (pytest-xdist; WORKBENCH_TEST_WORKERS to change) on a 2-core machine: a test spends much of
# its time waiting on ranks, engines, kernels and the browser, so two workers left the cores idle part of the
# time (1,518 tests: 15 min 51 s on two, 14 min 32 s on three using 1.6 of the 2 cores, 14 min 56 s on four).
# Each module and each notebook runs whole on one worker, in the order tests/conftest.py sets (xdist would
# otherwise start the files with the most tests first, and notebooks 03 and 05 before the tests whose runs they
# take). The 25 slowest tests close every run, so a test that grows past its share is seen in CI's log.
python3 -m pytest -n "${WORKBENCH_TEST_WORKERS:-3}" --dist loadfile --no-loadscope-reorder --durations=25 "$@"

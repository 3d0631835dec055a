#!/usr/bin/env bash
# Installs what the tests need on a fresh machine (Python 3.11; Debian packages where this runs as
# root with apt; Python packages at the versions constraints.txt pins, the ones CI tested) and runs
# every test. The README's test command; CI (.ci/run) runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
# OpenMPI: MLX's MPI backend is the CPU backend that can split groups (HSDP).
if ! command -v mpirun >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null
  else
    echo "note: mpirun not found and Debian packages cannot be installed here; the MPI (HSDP) tests will be skipped"
  fi
fi
# Chromium (Debian's): the browser tests drive it through playwright (never `playwright install`, whose
# browser download is not a package), and kaleido renders static figures with it.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "note: chromium not found and Debian packages cannot be installed here; the browser tests will be skipped"
  fi
fi
python3 -m pip install -q -c constraints.txt -e ".[all,test]"
python3 -m pytest "$@"

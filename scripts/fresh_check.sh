#!/usr/bin/env bash
# The newcomer's check: clone the repository (its committed HEAD) into a temporary folder, make a
# brand-new virtual environment, and run the README's two commands exactly as the README prints them,
# timing each. Run it before a stop that touches dependencies, notebooks, stored outputs or the CLI.
#
#   bash scripts/fresh_check.sh                 # command 1 (the main job), then command 2 (the tests)
#   bash scripts/fresh_check.sh --load          # command 1 alone, then again with a CPU-heavy process beside it
#   bash scripts/fresh_check.sh --only 1|2      # one of the two commands
#   bash scripts/fresh_check.sh --keep          # keep the temporary folder (its path is printed)
#
# pip's download cache is shared with this machine; nothing else is: no installed package, no run store,
# no build output. A summary with the times, the exit codes and the versions pinned ends the output.
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
only="" load=0 keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --only) only="$2"; shift 2 ;;
    --load) load=1; shift ;;
    --keep) keep=1; shift ;;
    *) echo "fresh_check: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done

work="$(mktemp -d /tmp/fresh_check.XXXXXX)"
hog_pid=""
cleanup() {
  [ -n "$hog_pid" ] && kill "$hog_pid" 2>/dev/null
  if [ "$keep" = 1 ]; then echo "fresh_check: kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

git clone -q "$here" "$work/main" || exit 1
# CI runs with the steering folder beside the clone; so does this check.
[ -d "$here/../shared" ] && ln -s "$(cd "$here/../shared" && pwd)" "$work/shared"
python3 -m venv "$work/venv" || exit 1
# shellcheck disable=SC1091
. "$work/venv/bin/activate"
cd "$work/main" || exit 1
echo "fresh_check: clone of $(git rev-parse --short HEAD) in $work/main, venv $VIRTUAL_ENV ($(python3 --version))"

# The README's first fenced block holds exactly the two commands (tests/test_packaging.py holds it so).
mapfile -t commands < <(awk '/^```/{n++; next} n==1 && NF && !/^#/' README.md)
[ "${#commands[@]}" = 2 ] || { echo "fresh_check: expected 2 commands in the README's first block, found ${#commands[@]}"; exit 1; }

summary=()
run_command() {  # run_command LABEL COMMAND
  local label="$1" cmd="$2" t0 rc secs
  echo "fresh_check: [$label] \$ $cmd"
  t0=$(date +%s)
  bash -c "$cmd" 2>&1 | tee "$work/$label.log"
  rc=${PIPESTATUS[0]}
  secs=$(( $(date +%s) - t0 ))
  summary+=("$(printf '%-26s exit %-3s %5d s (%d min %02d s)' "$label" "$rc" "$secs" $((secs / 60)) $((secs % 60)))")
  return "$rc"
}

status=0
if [ -z "$only" ] || [ "$only" = 1 ]; then
  run_command "command 1" "${commands[0]}" || status=1
  if [ "$load" = 1 ]; then
    # The same command again from scratch (build outputs and stored runs removed), with one core busy.
    rm -rf build runs
    python3 -c 'while True: pass' & hog_pid=$!
    run_command "command 1 under load" "${commands[0]}" || status=1
    kill "$hog_pid"; hog_pid=""
  fi
fi
if [ -z "$only" ] || [ "$only" = 2 ]; then
  run_command "command 2" "${commands[1]}" || status=1
fi

echo
echo "fresh_check summary ($(nproc) cores; $(python3 --version))"
printf '  %s\n' "${summary[@]}"
echo "  pinned (constraints.txt): $(grep -iE '^(numpy|pandas|plotly|jax|flax|optax|mlx|ipyparallel|jupyterlab|nbval|nbclient|pytest)==' constraints.txt | tr '\n' ' ')"
echo "  installed: $(python3 -m pip freeze --exclude-editable 2>/dev/null | grep -iE '^(numpy|pandas|plotly|jax|mlx)==' | tr '\n' ' ')"
[ "$status" = 0 ] && echo "fresh_check: PASS" || echo "fresh_check: FAIL"
exit "$status"

#!/usr/bin/env bash
# Re-resolves constraints.txt: installs the workbench with every extra into a brand-new virtual
# environment WITHOUT the constraints (so pip takes the newest releases pyproject.toml's bounds allow),
# and writes what it got as the pins the README commands and CI install. After running it, refresh the
# stored notebook outputs (python3 -m workbench refresh) and run scripts/fresh_check.sh.
#   bash scripts/update_constraints.sh [--check]   # --check: only report pins that are not the newest
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$(mktemp -d)/venv"
trap 'rm -rf "$(dirname "$venv")"' EXIT
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q -e ".[all,test]"
newest="$(mktemp)"
{
  echo "# Pins for the README commands and CI: what 'pip install -e \".[all,test]\"' resolved to, newest within"
  echo "# pyproject.toml's bounds, on $(date -u +%Y-%m-%d) with Python $("$venv/bin/python" -c 'import platform; print(platform.python_version())') on $(uname -s) $(uname -m)."
  echo "# Regenerate with: bash scripts/update_constraints.sh"
  "$venv/bin/python" -m pip freeze --exclude-editable | LC_ALL=C sort -f
} > "$newest"
if [ "${1:-}" = "--check" ]; then
  diff <(grep -v '^#' constraints.txt) <(grep -v '^#' "$newest") && echo "constraints.txt holds the newest releases the bounds allow"
  rm -f "$newest"
else
  mv "$newest" constraints.txt
  echo "wrote constraints.txt ($(grep -vc '^#' constraints.txt) pins)"
fi

#!/usr/bin/env bash
# The test suite (default: everything not marked slow), in the setup.sh venv.
#   run_scripts/test.sh [pytest args]      e.g. run_scripts/test.sh -m slow
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VENV:-$repo/.venv}"
cd "$repo"
export PATH="$venv/bin:$PATH"
if [ $# -eq 0 ]; then set -- -m "not slow"; fi
exec "$venv/bin/python" -m pytest "$@"

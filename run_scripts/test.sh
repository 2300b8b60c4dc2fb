#!/usr/bin/env bash
# The test suite, in one DLIO's environment or several, set up first if missing.
#   run_scripts/test.sh [--dlio 2.0.0|upstream|mlcommons|both|all] [pytest args]
#   run_scripts/test.sh                     2.0.0, everything not marked slow
#   run_scripts/test.sh --dlio all          all three DLIOs (what CI runs)
#   run_scripts/test.sh --dlio both         PyPI 2.0.0 and upstream main
#   run_scripts/test.sh -m slow             the long tests
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$repo"
if [ $# -eq 0 ]; then set -- -m "not slow"; fi
flavours=("$dlio")
[ "$dlio" = both ] && flavours=(2.0.0 upstream)
[ "$dlio" = all ] && flavours=(2.0.0 upstream mlcommons)
status=0
for flavour in "${flavours[@]}"; do
  ensure_env "$flavour"
  echo "=== tests with DLIO $flavour ($venv)"
  PATH="$venv/bin:$PATH" "$venv/bin/python" -m pytest "$@" || status=$?
done
exit $status

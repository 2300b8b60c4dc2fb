#!/usr/bin/env bash
# The test suite, in one environment or several, each set up first if missing.
#   run_scripts/test.sh [--dlio 2.0.0|upstream|mlcommons[,...]] [--python X.Y[,X.Y...]] [pytest args]
#   run_scripts/test.sh                          PyPI's DLIO 2.0.0, everything not marked slow
#   run_scripts/test.sh --python 3.11,3.12       the same on Python 3.11 and on 3.12 (what CI runs)
#   DLIO_UPSTREAM_SRC=DIR run_scripts/test.sh --dlio upstream
#                                                upstream DLIO main from your checkout
#   DLIO_MLCOMMONS_SRC=DIR [MLPSTORAGE_SRC=DIR] run_scripts/test.sh --dlio mlcommons --python 3.12
#                                                MLCommons' fork (and mlpstorage) from your checkouts
#   run_scripts/test.sh -m slow                  the long tests
# Tests that need a DLIO or one of MLCommons' tools that is not in the environment
# are skipped, with the variable that would bring it in their reason.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$repo"
if [ $# -eq 0 ]; then set -- -m "not slow"; fi
status=0
IFS=, read -r -a flavours <<< "$dlios"
IFS=, read -r -a versions <<< "${pythons:-}"
[ ${#versions[@]} -gt 0 ] || versions=("")
for flavour in "${flavours[@]}"; do
  for version in "${versions[@]}"; do
    ensure_env "$flavour" "$version"
    echo "=== tests with DLIO $flavour, $("$venv/bin/python" -V) ($venv)"
    start=$SECONDS
    PATH="$venv/bin:$PATH" "$venv/bin/python" -m pytest "$@" || status=$?
    echo "=== DLIO $flavour, $("$venv/bin/python" -V): $((SECONDS - start)) s"
  done
done
exit $status

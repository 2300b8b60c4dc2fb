#!/usr/bin/env bash
# Set up whatever is missing, then run the quickstart benchmark: the tiny
# preset on NP ranks (default 2) under mpirun and DLIO.
#   run_scripts/quickstart.sh [--dlio 2.0.0|upstream|mlcommons] [--python X.Y] [NP] [hydra overrides...]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
ensure_env "$dlio" "${pythons%%,*}"
np=2
if [[ "${1:-}" =~ ^[0-9]+$ ]]; then np="$1"; shift; fi
extra=()
[ "$(id -u)" = 0 ] && extra+=(--allow-run-as-root)
[ "$np" -gt "$(nproc)" ] && extra+=(--oversubscribe)
export PATH="$venv/bin:$PATH"
exec mpirun "${extra[@]}" -np "$np" dlio_benchmark workload=llama3_tiny_checkpoint "$@"

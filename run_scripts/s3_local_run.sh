#!/usr/bin/env bash
# Run a preset against a throw-away local S3 server (SeaweedFS on 127.0.0.1),
# setting up DLIO's environment first if it is missing. LINK_LATENCY_MS and
# LINK_RATE_MB_S put an emulated remote link in front of the server.
#   run_scripts/s3_local_run.sh [--dlio 2.0.0|upstream|mlcommons] [--python X.Y] [NP] [WORKLOAD] [extra hydra overrides...]
#   run_scripts/s3_local_run.sh 2 llama3_tiny_checkpoint ++workload.streaming.verify=True
#   LINK_LATENCY_MS=10 LINK_RATE_MB_S=40 run_scripts/s3_local_run.sh 2
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
ensure_env "$dlio" "${pythons%%,*}"
np="${1:-2}"; workload="${2:-llama3_tiny_checkpoint}"; shift $(( $# > 2 ? 2 : $# ))
export PATH="$venv/bin:$PATH"
root=()
[ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
exec "$venv/bin/python" -m dlio_ckpt_ext.tools.local_s3 --bucket ckpt \
  --latency-ms "${LINK_LATENCY_MS:-0}" --rate-mb-s "${LINK_RATE_MB_S:-0}" -- \
  mpirun "${root[@]}" --oversubscribe -np "$np" dlio_benchmark "workload=$workload" \
  ++workload.storage.storage_type=s3 ++workload.storage.storage_root=s3://ckpt "$@"

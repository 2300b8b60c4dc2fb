#!/usr/bin/env bash
# The real libraries' saves of our test shape, each recorded as a manifest
# (fidelity/manifests/NAME.json) that tests/test_fidelity.py compares our layouts with,
# and their saves into an S3 server through their frameworks' own clients, each recorded
# as a request manifest (fidelity/manifests/requests/NAME.json, fidelity/record_requests.py).
#   fidelity/run.sh            every save below
#   fidelity/run.sh dcp orbax  the saves whose names start with these
# Builds its own virtual environment on Python 3.12, outside the repository and
# outside CI: fidelity/requirements.txt (torch brings its CUDA libraries, about
# 6 GB), then DeepSpeed, which builds against the installed torch
# (--no-build-isolation). Needs strace. FIDELITY_VENV moves the venv;
# FIDELITY_SCRATCH the saves (removed after each is recorded).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../run_scripts/env.sh"
venv="${FIDELITY_VENV:-$HOME/.cache/dlio-ckpt-ext/fidelity-venv}"
scratch="${FIDELITY_SCRATCH:-${TMPDIR:-/tmp}/dlio-ckpt-fidelity}"
deepspeed_pin="deepspeed==0.19.8"
command -v strace >/dev/null || { echo "fidelity/run.sh needs strace (apt-get install strace)" >&2; exit 2; }

stamp="$venv/.fidelity-requirements"
want="$(cat "$here/requirements.txt" | sha256sum | cut -c1-16) $deepspeed_pin"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  python="$(find_python 3.12)"
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  "$venv/bin/pip" install -q -r "$here/requirements.txt"
  "$venv/bin/pip" install -q --no-build-isolation "$deepspeed_pin"
  echo "$want" > "$stamp"
fi
py="$venv/bin/python"

# NAME  SCRIPT  ARGUMENTS
saves="
dcp-fsdp2-w1            save_dcp.py        --world 1
dcp-fsdp2-w2            save_dcp.py        --world 2
dcp-fsdp2-w4            save_dcp.py        --world 4
deepspeed-zero1-w1      save_deepspeed.py  --world 1 --stage 1
deepspeed-zero1-w2      save_deepspeed.py  --world 2 --stage 1
deepspeed-zero1-w4      save_deepspeed.py  --world 4 --stage 1
deepspeed-zero3-w1      save_deepspeed.py  --world 1 --stage 3
deepspeed-zero3-w2      save_deepspeed.py  --world 2 --stage 3
deepspeed-zero3-w4      save_deepspeed.py  --world 4 --stage 3
megatron-dp-w1          save_megatron.py   --world 1
megatron-dp-w2          save_megatron.py   --world 2
megatron-dp-w4          save_megatron.py   --world 4
megatron-tp2-w2         save_megatron.py   --world 2 --tp 2
megatron-tp2-w4         save_megatron.py   --world 4 --tp 2
megatron-dp-buckets-w2  save_megatron.py   --world 2 --overlap-grad-reduce
orbax-d1-w1             save_orbax.py      --world 1 --devices-per-process 1
orbax-d1-w2             save_orbax.py      --world 2 --devices-per-process 1
orbax-d1-w4             save_orbax.py      --world 4 --devices-per-process 1
orbax-d4-w1             save_orbax.py      --world 1 --devices-per-process 4
orbax-d4-w2             save_orbax.py      --world 2 --devices-per-process 4
safetensors-10MB-w1     save_hf.py         --world 1 --max-shard-size 10MB
safetensors-default-w1  save_hf.py         --world 1
"

# NAME  SCRIPT  STORAGE_LIBRARY  ARGUMENTS: saved into a local SeaweedFS (bucket ckpt, prefix NAME)
requests="
dcp-fsdp2-s3torchconnector-w2  save_dcp.py       s3torchconnector  --world 2 --s3 s3://ckpt/dcp-fsdp2-s3torchconnector-w2
megatron-dp-msc-w2             save_megatron.py  msc               --world 2 --msc msc://ckpt/megatron-dp-msc-w2
orbax-d1-tensorstore-w2        save_orbax.py     tensorstore       --world 2 --devices-per-process 1 --s3 s3://ckpt/orbax-d1-tensorstore-w2
"

cd "$here/.."
status=0
while read -r name script args; do
  [ -n "$name" ] || continue
  if [ $# -gt 0 ]; then
    match=0
    for want in "$@"; do case "$name" in "$want"*) match=1 ;; esac; done
    [ $match = 1 ] || continue
  fi
  echo "=== $name"
  # shellcheck disable=SC2086
  if ! DS_ACCELERATOR=cpu "$py" "$here/record.py" --manifest "$here/manifests/$name.json" --out "$scratch/$name" \
      -- "$py" "$here/$script" --out "$scratch/$name" $args; then
    echo "=== $name FAILED" >&2
    status=1
  fi
  rm -rf "${scratch:?}/$name"
done <<< "$saves"
# the server: SeaweedFS from our own environment (run_scripts/setup.sh installs it there)
ensure_env 2.0.0 3.12 >/dev/null
while read -r name script library args; do
  [ -n "$name" ] || continue
  if [ $# -gt 0 ]; then
    match=0
    for want in "$@"; do case "$name" in "$want"*) match=1 ;; esac; done
    [ $match = 1 ] || continue
  fi
  echo "=== $name (requests)"
  # shellcheck disable=SC2086
  if ! "$venv/bin/python" -m dlio_ckpt_ext.tools.local_s3 --bucket ckpt -- "$py" "$here/record_requests.py" \
      --manifest "$here/manifests/requests/$name.json" --out "$scratch/$name" --prefix "$name" --library "$library" \
      -- "$py" "$here/$script" --out "$scratch/$name" $args; then
    echo "=== $name FAILED" >&2
    status=1
  fi
  rm -rf "${scratch:?}/$name"
done <<< "$requests"
exit $status

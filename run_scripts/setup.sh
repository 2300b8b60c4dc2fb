#!/usr/bin/env bash
# One-command setup of a virtual environment with one DLIO, its real runtime
# imports, an MPI runtime from PyPI, and this package. Safe to run again.
#   run_scripts/setup.sh [--dlio 2.0.0|upstream|mlcommons] [VENV_DIR]
#     --dlio 2.0.0      PyPI's dlio-benchmark 2.0.0 (default), venv .venv
#     --dlio upstream   upstream DLIO main from the vendored snapshot
#                       (DLIO_UPSTREAM_SRC, default ../shared/vendor/dlio_benchmark-*.tar.gz),
#                       venv .venv-upstream
#     --dlio mlcommons  MLCommons' DLIO fork, the one mlpstorage pins, and mlpstorage itself
#                       (DLIO_MLCOMMONS_SRC, default ../shared/vendor/dlio_mlcommons-*.tar.gz;
#                       MLPSTORAGE_SRC, default ../shared/vendor/mlcommons_storage-*.tar.gz),
#                       venv .venv-mlcommons
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dlio="${DLIO:-2.0.0}"
if [ "${1:-}" = "--dlio" ]; then dlio="$2"; shift 2; fi
case "$dlio" in
  2.0.0) default_venv="$repo/.venv" ;;
  upstream) default_venv="$repo/.venv-upstream" ;;
  mlcommons) default_venv="$repo/.venv-mlcommons" ;;
  *) echo "setup.sh: --dlio takes 2.0.0, upstream or mlcommons, not '$dlio'" >&2; exit 2 ;;
esac
venv="${1:-${VENV:-$default_venv}}"
python="${PYTHON:-python3}"

"$python" - <<'PY'
import sys
if sys.version_info[:2] < (3, 10):
    sys.exit(f"Python >= 3.10 is required, found {sys.version.split()[0]}")
PY

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip setuptools wheel
# DLIO's declared dependencies (nvidia-dali, torch, torchvision, torchaudio,
# tensorflow) cannot be installed offline or are not used: take the package
# alone and install what it really imports from requirements/.
vendored() {  # vendored VAR PATTERN -> an archive or checkout to install from
  local src="${!1:-}"
  if [ -z "$src" ]; then
    src="$(ls "$repo"/../shared/vendor/$2 2>/dev/null | head -n 1 || true)"
  fi
  [ -n "$src" ] && [ -e "$src" ] || {
    echo "setup.sh: no source for $2: set $1 to a checkout or archive of $3" >&2; exit 2; }
  echo "$src"
}
case "$dlio" in
  upstream)
    "${pip[@]}" install --no-deps --force-reinstall \
      "$(vendored DLIO_UPSTREAM_SRC 'dlio_benchmark-*.tar.gz' github.com/argonne-lcf/dlio_benchmark)" ;;
  mlcommons)
    # Both ask for Python >= 3.12 in their metadata and run on 3.10+ (tested on 3.11).
    "${pip[@]}" install --no-deps --force-reinstall --ignore-requires-python \
      "$(vendored DLIO_MLCOMMONS_SRC 'dlio_mlcommons-*.tar.gz' github.com/mlcommons/DLIO_local_changes)"
    # mlpstorage finds its workload configs beside its package (../configs), so it
    # runs from an unpacked source tree, installed editable.
    src="$(vendored MLPSTORAGE_SRC 'mlcommons_storage-*.tar.gz' github.com/mlcommons/storage)"
    if [ -f "$src" ]; then
      rm -rf "$venv/src/mlcommons_storage" && mkdir -p "$venv/src/mlcommons_storage"
      tar -xzf "$src" -C "$venv/src/mlcommons_storage" --strip-components=1
      src="$venv/src/mlcommons_storage"
    fi
    "${pip[@]}" install --no-deps --ignore-requires-python -e "$src" ;;
  *)
    "${pip[@]}" install --no-deps dlio-benchmark==2.0.0 ;;
esac
"${pip[@]}" install -r "$repo/requirements/common.txt" -r "$repo/requirements/dlio-$dlio.txt" \
  -r "$repo/requirements/test.txt"
# compat mode: a plain path entry, which hydra's plugin scan (pkgutil) can walk
"${pip[@]}" install --no-deps -e "$repo" --config-settings editable_mode=compat
echo "setup done ($dlio): source $venv/bin/activate"

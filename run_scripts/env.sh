# Sourced by the run scripts: parse --dlio and --python, find the interpreter,
# then make sure that DLIO's environment exists and matches the checkout
# (setup.sh runs only when the venv is missing or its requirements changed
# since it was built).
#   --dlio 2.0.0|upstream|mlcommons[,...]   which DLIO (default 2.0.0, PyPI's)
#   --python 3.12[,3.11...]                 which Python (default: $PYTHON, else python3)
#   after sourcing: $repo, $dlios, $pythons set; "$@" holds the remaining arguments
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dlios="${DLIO:-2.0.0}"
pythons=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dlio) dlios="$2"; shift 2 ;;
    --python) pythons="$2"; shift 2 ;;
    *) break ;;
  esac
done
dlio="${dlios%%,*}"  # the scripts that run one environment take the first

find_python() {  # find_python VERSION|PATH -> an interpreter: pythonX.Y on PATH, else pyenv's newest X.Y
  local want="$1" cand
  case "$want" in */*) echo "$want"; return 0 ;; esac
  for cand in "python$want" \
      $(ls -d "$(pyenv root 2>/dev/null || echo /nonexistent)/versions/$want".*/bin/"python$want" 2>/dev/null | sort -rV); do
    if "$cand" -c "import sys" >/dev/null 2>&1; then
      command -v "$cand"
      return 0
    fi
  done
  echo "no Python $want: neither python$want on PATH nor under pyenv; install it or give --python a path" >&2
  return 2
}

ensure_env() {  # ensure_env 2.0.0|upstream|mlcommons [PYTHON_VERSION] -> sets venv
  local flavour="$1" version="${2:-}" python stamp want
  case "$flavour" in
    2.0.0) venv="${VENV:-$repo/.venv}" ;;
    upstream) venv="${VENV_UPSTREAM:-$repo/.venv-upstream}" ;;
    mlcommons) venv="${VENV_MLCOMMONS:-$repo/.venv-mlcommons}" ;;
    *) echo "--dlio takes 2.0.0, upstream or mlcommons (comma-separated for several), not '$flavour'" >&2
       return 2 ;;
  esac
  python="${PYTHON:-python3}"
  if [ -n "$version" ]; then
    python="$(find_python "$version")" || return 2
    venv="$venv-py$version"
  fi
  stamp="$venv/.dlio-ckpt-ext-setup"
  # the sources a user names are part of what the environment was built from
  want="$flavour $("$python" -c 'import sys; print(sys.version.split()[0])') ${DLIO_UPSTREAM_SRC:-}"
  want="$want ${DLIO_MLCOMMONS_SRC:-} ${MLPSTORAGE_SRC:-} $(cat "$repo"/requirements/*.txt \
    "$repo/run_scripts/setup.sh" "$repo/setup.py" | sha256sum | cut -c1-16)"
  if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    PYTHON="$python" "$repo/run_scripts/setup.sh" --dlio "$flavour" "$venv" || return $?
    echo "$want" > "$stamp"
  fi
}

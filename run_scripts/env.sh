# Sourced by the run scripts: parse --dlio, then make sure that DLIO's
# environment exists and matches the checkout (setup.sh runs only when the
# venv is missing or its requirements changed since it was built).
#   after sourcing: $repo, $dlio, $venv set; "$@" holds the remaining arguments
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dlio="${DLIO:-2.0.0}"
if [ "${1:-}" = "--dlio" ]; then dlio="$2"; shift 2; fi

ensure_env() {  # ensure_env 2.0.0|upstream|mlcommons -> sets venv
  local flavour="$1" stamp want
  case "$flavour" in
    2.0.0) venv="${VENV:-$repo/.venv}" ;;
    upstream) venv="${VENV_UPSTREAM:-$repo/.venv-upstream}" ;;
    mlcommons) venv="${VENV_MLCOMMONS:-$repo/.venv-mlcommons}" ;;
    *) echo "--dlio takes 2.0.0, upstream, mlcommons, both or all, not '$flavour'" >&2; return 2 ;;
  esac
  stamp="$venv/.dlio-ckpt-ext-setup"
  want="$flavour $(cat "$repo"/requirements/*.txt "$repo/run_scripts/setup.sh" "$repo/setup.py" | sha256sum | cut -c1-16)"
  if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    "$repo/run_scripts/setup.sh" --dlio "$flavour" "$venv"
    echo "$want" > "$stamp"
  fi
}

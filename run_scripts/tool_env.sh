#!/usr/bin/env bash
# The virtual environments of the tools our users judge results with, each of
# its own (they are not ours, and their dependencies are not DLIO's). Safe to
# run again; the tests call it when an environment is missing.
#   run_scripts/tool_env.sh mlcommons   MLCommons' submission checker and report generator
#                                       (mlpstorage 3.0.26 from ../shared/vendor, or MLPSTORAGE_SRC=),
#                                       venv .venv-tool-mlcommons
#   run_scripts/tool_env.sh dftracer    dftracer's trace analysers: dftracer-analyzer 0.0.9 (dfanalyzer) with
#                                       dftracer-utils 0.0.12 (dftracer_validate, dftracer_stats, ...), the
#                                       pair that works together (0.0.14 lacks a name the analyser imports),
#                                       venv .venv-tool-dftracer
# Prints the environment's python on its last line.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tool="${1:-}"
python="${PYTHON:-python3}"
case "$tool" in
  mlcommons) venv="${VENV_TOOL_MLCOMMONS:-$repo/.venv-tool-mlcommons}" ;;
  dftracer) venv="${VENV_TOOL_DFTRACER:-$repo/.venv-tool-dftracer}" ;;
  *) echo "tool_env.sh: takes mlcommons or dftracer, not '$tool'" >&2; exit 2 ;;
esac
stamp="$venv/.tool-env"
want="$tool $(sha256sum "$0" | cut -c1-16)"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
  case "$tool" in
    mlcommons)
      src="${MLPSTORAGE_SRC:-$(ls "$repo"/../shared/vendor/mlcommons_storage-*.tar.gz 2>/dev/null | head -n 1 || true)}"
      [ -n "$src" ] && [ -e "$src" ] || {
        echo "tool_env.sh: no mlpstorage source: set MLPSTORAGE_SRC to a checkout or archive of" \
             "github.com/mlcommons/storage" >&2; exit 2; }
      if [ -f "$src" ]; then  # the checker reads its reference configs beside its package: unpack, editable
        rm -rf "$venv/src/mlcommons_storage" && mkdir -p "$venv/src/mlcommons_storage"
        tar -xzf "$src" -C "$venv/src/mlcommons_storage" --strip-components=1
        src="$venv/src/mlcommons_storage"
      fi
      # it asks for Python 3.12 and runs on 3.11 with these (the checker's and the report generator's imports)
      "${pip[@]}" install pyyaml psutil packaging rich pydantic python-dotenv >&2
      "${pip[@]}" install --no-deps --ignore-requires-python -e "$src" >&2 ;;
    dftracer)
      "${pip[@]}" install dftracer-analyzer==0.0.9 dftracer-utils==0.0.12 >&2 ;;
  esac
  echo "$want" > "$stamp"
fi
echo "$venv/bin/python"

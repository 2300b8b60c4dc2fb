#!/usr/bin/env bash
# The virtual environments of the tools our users judge results with, each of
# its own (they are not ours, and their dependencies are not DLIO's). Safe to
# run again; the tests call it when an environment is missing.
#   MLPSTORAGE_SRC=DIR run_scripts/tool_env.sh mlcommons
#                           MLCommons' submission checker and report generator, from your own checkout
#                           of github.com/mlcommons/storage (mlpstorage >= 3.0.26), on Python >= 3.12
#                           (PYTHON=, else python3.12 found as test.sh --python finds it);
#                           venv .venv-tool-mlcommons
#   run_scripts/tool_env.sh dftracer
#                           dftracer's trace analysers: dftracer-analyzer 0.0.9 (dfanalyzer) with
#                           dftracer-utils 0.0.12 (dftracer_validate, dftracer_stats, ...), the pair
#                           that works together (0.0.14 lacks a name the analyser imports);
#                           venv .venv-tool-dftracer
# Prints the environment's python on its last line.
set -euo pipefail
tool="${1:-}"
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
case "$tool" in
  mlcommons)
    venv="${VENV_TOOL_MLCOMMONS:-$repo/.venv-tool-mlcommons}"
    if [ -z "${MLPSTORAGE_SRC:-}" ] || [ ! -d "$MLPSTORAGE_SRC" ]; then
      echo "tool_env.sh: MLCommons' checker runs from your own checkout of github.com/mlcommons/storage:" \
           "set MLPSTORAGE_SRC to its directory" >&2; exit 2
    fi
    python="${PYTHON:-$(find_python 3.12)}" ;;
  dftracer) venv="${VENV_TOOL_DFTRACER:-$repo/.venv-tool-dftracer}"; python="${PYTHON:-python3}" ;;
  *) echo "tool_env.sh: takes mlcommons or dftracer, not '$tool'" >&2; exit 2 ;;
esac
stamp="$venv/.tool-env"
want="$tool ${MLPSTORAGE_SRC:-} $(sha256sum "$0" | cut -c1-16)"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  rm -rf "$venv"
  "$python" -m venv "$venv"
  pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
  case "$tool" in
    mlcommons)
      # the checker reads its reference configs beside its package: editable, from the checkout;
      # with what the checker and the report generator import
      "${pip[@]}" install pyyaml psutil -r "$repo/requirements/mlpstorage.txt" >&2
      "${pip[@]}" install --no-deps -e "$MLPSTORAGE_SRC" >&2 ;;
    dftracer)
      "${pip[@]}" install dftracer-analyzer==0.0.9 dftracer-utils==0.0.12 >&2 ;;
  esac
  echo "$want" > "$stamp"
fi
echo "$venv/bin/python"

#!/usr/bin/env bash
# The test suite's timing-sensitive tests on a loaded machine: every core kept
# busy by another process (a spinning loop per CPU, at normal priority) while
# the tests run N times in a row; stops at the first failure.
#   run_scripts/under_load.sh [--times N] [--python X.Y] [pytest args]   (default: 5 times, the flaky set)
set -euo pipefail
times=5
if [ "${1:-}" = "--times" ]; then times="$2"; shift 2; fi
py=()
if [ "${1:-}" = "--python" ]; then py=(--python "$2"); shift 2; fi
cd "$(dirname "$0")/.."
if [ $# -eq 0 ]; then
  # the tests that failed at a stop while other work ran beside them
  set -- "tests/test_trace_tools.py::test_dfanalyzer_dlio_preset_shows_a_checkpoint_layer_agreeing_with_our_windows" \
    "tests/test_hostile_input.py::test_sigterm_with_the_output_piped_still_says_what_was_interrupted_and_what_finished" \
    "tests/test_cloud_run.py::test_a_run_killed_mid_save_leaves_blocks_that_status_lists_and_removes" \
    "tests/test_binding.py::test_the_quickstarts_run_prints_no_warning" \
    "tests/test_trace_tools.py::test_our_spans_carry_their_arguments_on_the_thread_that_did_the_work" \
    "tests/test_s3_run.py::test_a_frozen_server_is_said_while_frozen_and_the_stall_kept" \
    "tests/test_stalls.py::test_a_stall_is_said_while_it_lasts_and_kept_with_its_checkpoint_and_file"
fi
spinners=()
for _ in $(seq "$(nproc)"); do
  python3 -c 'while True: pass' &
  spinners+=($!)
done
trap 'kill "${spinners[@]}" 2>/dev/null' EXIT
for i in $(seq "$times"); do
  echo "=== under load, pass $i of $times"
  run_scripts/test.sh "${py[@]}" "$@" -p no:cacheprovider
done
echo "=== under load: $times passes in a row"

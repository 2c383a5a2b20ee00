#!/usr/bin/env bash
# Set up .venv, .venv-0.33 and .venv-0.34 (if needed; scripts/setup_all.sh), then run the whole
# test suite on vLLM 0.32.0 (the unit tests, then the e2e tests), the cases of
# tests/on_vllm_0.33.txt on vLLM 0.33.0's Python and those of
# tests/on_vllm_0.34.txt on vLLM 0.34.0's (the overlays,
# scripts/setup_overlay.sh), CPU backend. Arguments go to every pytest run
# (e.g. -x, -k pd). Each part is timed against its budget and the table is
# printed at the end (scripts/budget.sh); fails if a run fails or the whole
# run is over its budget.
#
#   test.sh --real-pair [pytest args]   only the real-pair group (marker real_pair:
#                                       Qwen2.5-Coder-1.5B + its 0.5B drafter,
#                                       tests/test_e2e_real_pair.py), alone: the full
#                                       run has it too. About 5 minutes, and 2-3 more
#                                       the first time, to convert the pair.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --real-pair ]; then
  shift
  bash scripts/setup.sh
  bash scripts/setup_all.sh pair
  exec .venv/bin/python -m pytest -v -rA --durations=0 -m real_pair "$@" tests
fi
source scripts/budget.sh
budget_begin

# Set by .ci/run for this run only (not passed on to the tests):
# PPSPEC_SET_UP=1, it has run the set-up already; PPSPEC_WAIT_BEFORE_E2E, below.
set_up=${PPSPEC_SET_UP:-0}
wait_before_e2e=${PPSPEC_WAIT_BEFORE_E2E:-}
unset PPSPEC_SET_UP PPSPEC_WAIT_BEFORE_E2E
if [ "$set_up" != 1 ]; then
  budget_run setup bash scripts/setup_all.sh || exit
fi

# A run that collects no test (pytest's exit code 5) fails, unless the
# caller's selection (-k, a path) explains it: with arguments, a run may
# collect nothing (the e2e run of a -k that names unit tests), but the script
# fails if every run collected nothing (a selection that matches no test);
# without arguments each run must collect its tests. Each run's
# failures (pytest's "FAILED tests/..." and "ERROR tests/..." summary lines,
# not a captured log record that starts with "ERROR") are gathered
# in .cache/failed-tests.txt and printed again at the very end of the run
# (here, or by .ci/run after the work it ran beside the unit tests), so the
# last lines of a long log name what failed.
FAILED_TESTS=.cache/failed-tests.txt
mkdir -p .cache
: > "$FAILED_TESTS"
pytest_run() {
  local status=0 log
  log=$(mktemp "${TMPDIR:-/tmp}/ppspec-pytest.XXXXXX")
  "$@" 2>&1 | tee "$log" || status=$?
  grep -E '^(FAILED|ERROR) [^ ]+\.py( |::|$)' "$log" >> "$FAILED_TESTS" || true
  rm -f "$log"
  PYTEST_RUNS=$((PYTEST_RUNS + 1))
  if [ "$status" -eq 5 ]; then
    if [ "$USER_ARGS" -gt 0 ]; then
      EMPTY_RUNS=$((EMPTY_RUNS + 1))
      status=0
    else
      echo "== this run collected no test (pytest's exit code 5): the whole suite's runs must" \
        "each collect some"
    fi
  fi
  return "$status"
}
USER_ARGS=$#
PYTEST_RUNS=0
EMPTY_RUNS=0

status=0
PYTEST=(-m pytest -v -rA --durations=0)
# The unit tests, two at a time (pytest-xdist; a file's tests stay on one
# worker); the e2e tests one at a time: an engine takes both cores.
UNIT=(-n 2 --dist loadfile)
# The unit files that take longest start first (--no-loadscope-reorder: xdist
# hands out the files in this order; by their number of tests, its default,
# it left the two-test files of a minute each to the end of the run).
SLOW_FIRST=(peer_watch_link placement deployment_check cpu_ngram_threads version_guard drift
  eagle3_aux layout plugin_register ci_steps peer_watch_heartbeat no_v1_runner startup_check)
SLOW_FIRST=("${SLOW_FIRST[@]/#/tests/test_}")
SLOW_FIRST=("${SLOW_FIRST[@]/%/.py}")
mapfile -t UNIT_FILES < <(printf '%s\n' "${SLOW_FIRST[@]}" tests/test_*.py | awk '!seen[$0]++')
budget_run unit pytest_run .venv/bin/python "${PYTEST[@]}" "${UNIT[@]}" --no-loadscope-reorder \
  -m "not e2e" "$@" "${UNIT_FILES[@]}" || status=$?
# PPSPEC_WAIT_BEFORE_E2E: a file that gets an exit status when the set-up's
# second stage, started beside the unit tests, ends (.ci/run): the e2e tests
# wait for it, so that no engine shares the cores and the memory with the real
# models' conversion (and .venv-0.33 and the real models are ready).
if [ -n "$wait_before_e2e" ]; then
  while [ ! -s "$wait_before_e2e" ]; do sleep 1; done
fi
# --e2e-budget: what is left of the whole run's budget (docs/testing.md, "The budget").
budget_run e2e pytest_run .venv/bin/python "${PYTEST[@]}" -m e2e \
  --e2e-budget="$(budget_left)" "$@" tests || status=$?
echo "== vLLM 0.33.0 (overlay): the cases of tests/on_vllm_0.33.txt =="
mapfile -t cases < <(grep -v '^#' tests/on_vllm_0.33.txt)
budget_run vllm-0.33 pytest_run .venv-0.33/bin/python "${PYTEST[@]}" "${UNIT[@]}" \
  --no-loadscope-reorder --expect-vllm=0.33.0 -m "not e2e" "$@" "${cases[@]}" || status=$?
budget_run vllm-0.33 pytest_run .venv-0.33/bin/python "${PYTEST[@]}" --expect-vllm=0.33.0 \
  -m e2e --e2e-budget="$(budget_left)" "$@" "${cases[@]}" || status=$?
# 0.34.0 removed the V1 runner: its cases start no engine (the hook, the refusal).
echo "== vLLM 0.34.0 (overlay): the cases of tests/on_vllm_0.34.txt =="
mapfile -t cases < <(grep -v '^#' tests/on_vllm_0.34.txt)
budget_run vllm-0.34 pytest_run .venv-0.34/bin/python "${PYTEST[@]}" --expect-vllm=0.34.0 \
  -m "not e2e" "$@" "${cases[@]}" || status=$?
if [ "$USER_ARGS" -gt 0 ] && [ "$PYTEST_RUNS" -gt 0 ] && [ "$EMPTY_RUNS" -eq "$PYTEST_RUNS" ]; then
  echo "== NO TEST COLLECTED by any of the $PYTEST_RUNS pytest runs with the arguments: $*"
  status=5
fi
if [ "$BUDGET_OWNER" = 1 ]; then
  print_failed_tests
  budget_report || status=$?
fi
exit "$status"

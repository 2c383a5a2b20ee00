#!/usr/bin/env bash
# One time budget for the whole run (docs/testing.md, "The budget"). Sourced
# by scripts/test.sh and .ci/run:
#
#   budget_begin                 start the record (only if no caller started one)
#   budget_run PART CMD...       run CMD, add "PART seconds exit-code" to the record
#   budget_left                  seconds left of BUDGET_LIMIT (pytest's --e2e-budget:
#                                an e2e run fails once the whole run is past the limit)
#   budget_report                print the table (each part's seconds, budget, passed
#                                or FAILED), and a warning when the whole run is over
#                                BUDGET_TOTAL; non-zero only past BUDGET_LIMIT
#
# The record is the file $PPSPEC_BUDGET_FILE; its first line is "start EPOCH".
# A part run twice counts twice. The parts' budgets add up to BUDGET_TOTAL,
# the goal (40 minutes): a part over its own budget is marked in the table and
# a run over the goal is warned about. The run fails on time only past
# BUDGET_LIMIT, which leaves CI's own limit (5400 s for .ci/run) 600 s for
# the clone, the teardown and a slow machine: a run that passes every test on
# a noisy machine lands.

BUDGET_TOTAL=2400
BUDGET_LIMIT=4800
BUDGET_PARTS=(setup unit e2e vllm-0.33 vllm-0.34 drift gate wheel)
declare -A BUDGET_SECONDS=(
  [setup]=330     # scripts/setup.sh + scripts/setup_overlay.sh, downloads alongside
  [unit]=210      # pytest -m "not e2e" on vLLM 0.32.0
  [e2e]=1290      # pytest -m e2e on vLLM 0.32.0 (its --e2e-budget too)
  [vllm-0.33]=350 # tests/on_vllm_0.33.txt on the overlay (its --e2e-budget too)
  [vllm-0.34]=30  # tests/on_vllm_0.34.txt on the 0.34 overlay (no engine)
  [drift]=60      # vllm_ppspec_tools.drift of 0.32.0, 0.33.0 and 0.34.0
  [gate]=90       # pre-commit run --all-files: ruff, ruff format, mypy on src/ (.ci/run)
  [wheel]=40      # scripts/check_wheel.sh
)

budget_begin() {
  BUDGET_OWNER=0
  if [ -z "${PPSPEC_BUDGET_FILE:-}" ]; then
    PPSPEC_BUDGET_FILE=$(mktemp "${TMPDIR:-/tmp}/ppspec-budget.XXXXXX")
    export PPSPEC_BUDGET_FILE
    echo "start $(date +%s)" > "$PPSPEC_BUDGET_FILE"
    BUDGET_OWNER=1
  fi
}

budget_run() {
  local part=$1 t0 status=0
  shift
  t0=$(date +%s)
  "$@" || status=$?
  echo "$part $(($(date +%s) - t0)) $status" >> "$PPSPEC_BUDGET_FILE"
  return "$status"
}

budget_elapsed() {
  local start
  start=$(awk '$1 == "start" { print $2 }' "$PPSPEC_BUDGET_FILE")
  echo $(($(date +%s) - start))
}

budget_left() {
  echo $((BUDGET_LIMIT - $(budget_elapsed)))
}

# The failed tests scripts/test.sh gathered, if any.
print_failed_tests() {
  local file=.cache/failed-tests.txt
  if [ -s "$file" ]; then
    echo "== FAILED TESTS ($(wc -l < "$file"), every pytest run of scripts/test.sh)"
    cat "$file"
  fi
}

budget_report() {
  local whole part seconds budget sum=0 mark result
  whole=$(budget_elapsed)
  echo "== BUDGET (docs/testing.md, \"The budget\")"
  printf '%-12s %8s %8s  %s\n' part seconds budget result
  for part in "${BUDGET_PARTS[@]}"; do
    seconds=$(awk -v p="$part" '$1 == p { s += $2; n++ } END { print n ? s : "-" }' \
      "$PPSPEC_BUDGET_FILE")
    # A part run twice failed if either run failed: the first non-zero code.
    result=$(awk -v p="$part" '$1 == p { n++; if ($3 != 0 && !c) c = $3 }
      END { print !n ? "-" : c ? "FAILED(exit " c ")" : "passed" }' "$PPSPEC_BUDGET_FILE")
    budget=${BUDGET_SECONDS[$part]}
    mark=""
    if [ "$seconds" != "-" ]; then
      sum=$((sum + seconds))
      [ "$seconds" -gt "$budget" ] && mark="  over its budget"
    fi
    printf '%-12s %8s %8s  %s%s\n' "$part" "$seconds" "$budget" "$result" "$mark"
  done
  printf '%-12s %8s\n' "(parts)" "$sum"
  if [ "$whole" -gt "$BUDGET_LIMIT" ]; then
    printf '%-12s %8s %8s  OVER THE LIMIT: the whole run must end within %s s\n' \
      "whole run" "$whole" "$BUDGET_TOTAL" "$BUDGET_LIMIT"
    return 1
  fi
  if [ "$whole" -gt "$BUDGET_TOTAL" ]; then
    printf '%-12s %8s %8s  over the goal of %s s (not a failure below %s s): share engine start-ups\n' \
      "whole run" "$whole" "$BUDGET_TOTAL" "$BUDGET_TOTAL" "$BUDGET_LIMIT"
    return 0
  fi
  printf '%-12s %8s %8s\n' "whole run" "$whole" "$BUDGET_TOTAL"
}

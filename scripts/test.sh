#!/usr/bin/env bash
# Set up .venv and .venv-0.33 (if needed), then run the whole test suite on
# vLLM 0.32.0 (the unit tests, then the e2e tests) and the cases of
# tests/on_vllm_0.33.txt on vLLM 0.33.0's Python (the overlay,
# scripts/setup_overlay.sh), CPU backend. Arguments go to every pytest run
# (e.g. -x, -k pd). Each part is timed against its budget and the table is
# printed at the end (scripts/budget.sh); fails if a run fails or the whole
# run is over its budget.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/budget.sh
budget_begin

# The wheels download while the installs run.
bash scripts/downloads.sh start vllm-0.33.0 smollm2

# budget_run runs it inside a `||`, where bash ignores `set -e`: each command
# says its own failure (tests/test_ci_steps.py).
setup() {
  bash scripts/setup.sh || return
  bash scripts/downloads.sh wait vllm-0.33.0 || return
  bash scripts/setup_overlay.sh
}

# A selection of the caller's (-k, a path) may leave one of the runs empty:
# pytest's exit code 5 (no tests collected) then counts as passed.
pytest_run() {
  local status=0
  "$@" || status=$?
  [ "$status" -eq 5 ] && [ "$USER_ARGS" -gt 0 ] && status=0
  return "$status"
}
USER_ARGS=$#

status=0
budget_run setup setup
PYTEST=(-m pytest -v -rA --durations=0)
budget_run unit pytest_run .venv/bin/python "${PYTEST[@]}" -m "not e2e" "$@" tests || status=$?
# --e2e-budget: what is left of the whole run's budget (docs/testing.md, "The budget").
budget_run e2e pytest_run .venv/bin/python "${PYTEST[@]}" -m e2e \
  --e2e-budget="$(budget_left)" "$@" tests || status=$?
echo "== vLLM 0.33.0 (overlay): the cases of tests/on_vllm_0.33.txt =="
mapfile -t cases < <(grep -v '^#' tests/on_vllm_0.33.txt)
budget_run vllm-0.33 pytest_run .venv-0.33/bin/python "${PYTEST[@]}" --expect-vllm=0.33.0 \
  --e2e-budget="$(budget_left)" "$@" "${cases[@]}" || status=$?
if [ "$BUDGET_OWNER" = 1 ]; then
  budget_report || status=$?
fi
exit "$status"

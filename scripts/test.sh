#!/usr/bin/env bash
# Set up .venv and .venv-0.33 (if needed), then run the whole test suite on
# vLLM 0.32.0 and the cases of tests/on_vllm_0.33.txt on vLLM 0.33.0's Python
# (the overlay, scripts/setup_overlay.sh), CPU backend. Arguments go to both
# pytest runs (e.g. -x, -k pd). Fails if either run fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/setup_overlay.sh
status=0
# --e2e-budget: see docs/testing.md ("The budget").
.venv/bin/python -m pytest -v -rA --durations=0 --e2e-budget=2400 "$@" tests || status=$?
echo "== vLLM 0.33.0 (overlay): the cases of tests/on_vllm_0.33.txt =="
mapfile -t cases < <(grep -v '^#' tests/on_vllm_0.33.txt)
.venv-0.33/bin/python -m pytest -v -rA --durations=0 --e2e-budget=600 "$@" "${cases[@]}" ||
  status=$?
exit "$status"

#!/usr/bin/env bash
# Set up .venv (if needed) and run the whole test suite on the CPU backend.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# --e2e-budget: see docs/testing.md ("The budget").
exec .venv/bin/python -m pytest -v -rA --durations=0 --e2e-budget=2400 "$@" tests

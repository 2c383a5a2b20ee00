#!/usr/bin/env bash
# Set up .venv (if needed), then run the main job: vllm serve with PP=2 +
# speculative decoding on tiny local models, queried through the OpenAI API.
# Extra arguments go to the demo, e.g. --method mtp --async-scheduling.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m vllm_ppspec.demo "$@"

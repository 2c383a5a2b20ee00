#!/usr/bin/env bash
# Set up .venv (if needed), then run the main job: vllm serve with PP=2 +
# speculative decoding on SmolLM2-135M (tiny local models with --tiny), queried
# through the OpenAI API.
# Extra arguments go to the demo, e.g. --method draft_model --async-scheduling.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m vllm_ppspec_tools.demo "$@"

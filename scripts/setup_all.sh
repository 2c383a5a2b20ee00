#!/usr/bin/env bash
# Set up everything the tests run on: .venv (scripts/setup.sh), then, once its
# wheel is downloaded, .venv-0.33 (scripts/setup_overlay.sh). Run by
# scripts/test.sh, and by .ci/run before it (the drift check, the gate and the
# wheel then run beside the unit tests). Fails on the first failing command.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/downloads.sh start vllm-0.33.0 smollm2
bash scripts/setup.sh
bash scripts/downloads.sh wait vllm-0.33.0
bash scripts/setup_overlay.sh

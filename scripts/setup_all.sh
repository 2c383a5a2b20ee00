#!/usr/bin/env bash
# Set up what the tests run on. Fails on the first failing command.
#
#   setup_all.sh          both stages below, in order (scripts/test.sh)
#   setup_all.sh venv     .venv (scripts/setup.sh) with suffix decoding's proposer
#                         (scripts/setup_suffix.sh), downloads started alongside
#   setup_all.sh overlay  once their wheels are downloaded, .venv-0.33 and
#                         .venv-0.34 (scripts/setup_overlay.sh), the real model
#                         converted (fixtures/real_model.py; cached), and beside
#                         them the real pair (as "pair")
#   setup_all.sh pair     the real pair converted (fixtures/real_pair.py, target
#                         and drafter side by side; cached), for the real-pair
#                         group alone (scripts/test.sh --real-pair)
#
# .ci/run runs "venv", then "overlay" beside the unit tests, which need neither.
set -euo pipefail
cd "$(dirname "$0")/.."
stage=${1:-all}
if [ "$stage" = all ] || [ "$stage" = venv ]; then
  bash scripts/downloads.sh start vllm-0.33.0 vllm-0.34.0 smollm2
  bash scripts/setup.sh
  bash scripts/setup_suffix.sh
fi
# The real pair's two conversions, one process each (about 9 and 4 GB at their
# peaks), side by side; convert_pair starts them, wait_pair waits for both.
pair=()
convert_pair() {
  trap 'kill "${pair[@]}" 2> /dev/null || true' EXIT
  for model in target drafter; do
    .venv/bin/python -m vllm_ppspec_tools.fixtures.real_pair "$model" &
    pair+=($!)
  done
}
wait_pair() {
  for pid in "${pair[@]}"; do
    wait "$pid"
  done
}
if [ "$stage" = all ] || [ "$stage" = overlay ]; then
  # The pair first, most of this stage's work: each conversion can take a core
  # the other work leaves idle.
  convert_pair
  bash scripts/downloads.sh wait vllm-0.33.0
  bash scripts/setup_overlay.sh
  bash scripts/downloads.sh wait vllm-0.34.0
  bash scripts/setup_overlay.sh 0.34.0
  .venv/bin/python -m vllm_ppspec_tools.fixtures.real_model
  wait_pair
fi
if [ "$stage" = pair ]; then
  convert_pair
  wait_pair
fi

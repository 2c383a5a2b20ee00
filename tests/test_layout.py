"""The package layout: public paths that users type keep working, the plugin
never imports the tools or fixtures, and the protocol never imports vLLM."""

from __future__ import annotations

import subprocess
import sys

import pytest

RUNTIME = [
    "vllm_ppspec.plugin",
    "vllm_ppspec.worker",
    "vllm_ppspec.scheduler",
    "vllm_ppspec.patches.config",
    "vllm_ppspec.patches.cpu_expand",
    "vllm_ppspec.patches.cpu_eager",
    "vllm_ppspec.patches.cpu_moe",
    "vllm_ppspec.patches.remote_reads",
    "vllm_ppspec.sched.filled",
    "vllm_ppspec.sched.lanes",
    "vllm_ppspec.runner.mixin",
    "vllm_ppspec.runner.startup_check",
    "vllm_ppspec.runner.cpu",
    "vllm_ppspec.runner.cpu_worker",
    "vllm_ppspec.runner.gpu_worker",
]
PROTOCOL = [
    "vllm_ppspec.protocol.rounds",
    "vllm_ppspec.protocol.lane_book",
    "vllm_ppspec.protocol.accepted_counts",
    "vllm_ppspec.protocol.accounting",
    "vllm_ppspec.protocol.dp_agreement",
    "vllm_ppspec.protocol.faults",
]
TOOLS = ["demo", "bench", "soak", "transport_bench", "async_cpu_bench"]


def _imports(modules: list[str]) -> set[str]:
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print('\\n'.join(sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return set(out.stdout.split())


def test_the_plugin_never_imports_the_tools_or_fixtures():
    loaded = _imports(RUNTIME)
    assert "vllm_ppspec.runner.mixin" in loaded
    assert not [m for m in loaded if m.startswith("vllm_ppspec_tools")]


def test_the_protocol_imports_no_vllm():
    loaded = _imports(PROTOCOL)
    assert not [m for m in loaded if m == "vllm" or m.startswith("vllm.")]


def test_public_names_keep_their_paths():
    from vllm_ppspec.sched.filled import PPSpecScheduler
    from vllm_ppspec.scheduler import PPSpecScheduler as public

    assert public is PPSpecScheduler
    from vllm_ppspec import WORKER_QUALNAME
    from vllm_ppspec.worker import PPSpecWorker

    assert WORKER_QUALNAME == "vllm_ppspec.worker.PPSpecWorker" and PPSpecWorker


@pytest.mark.parametrize("tool", TOOLS)
def test_python_m_tool_commands_keep_working(tool):
    """``python -m vllm_ppspec.<tool>`` runs the tool (its --help here)."""
    out = subprocess.run(
        [sys.executable, "-m", f"vllm_ppspec.{tool}", "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "usage:" in out.stdout

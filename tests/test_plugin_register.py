"""The general-plugin hook never stops vLLM (``plugin.register``): a failing
install is logged in one line, undone and recorded, vLLM goes on as without
the plugin, and the plugin's worker then refuses naming the failure. A local
version label of a supported release (``0.33.0+cpu``) installs as that release."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from vllm_ppspec import plugin
from vllm_ppspec.patches import config as config_patches
from vllm_ppspec.patches import install_state


def _ppspec_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The plugin's log lines at WARNING or above."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "vllm.ppspec" and r.levelno >= logging.WARNING
    ]


def test_a_failing_install_is_logged_and_the_plugin_worker_then_refuses_naming_it(
    monkeypatch, caplog
):
    def planted() -> None:
        raise AttributeError("planted: this build has no VllmConfig.use_v2_model_runner")

    monkeypatch.setattr(install_state, "failure", None)
    monkeypatch.setattr(config_patches, "install", planted)
    plugin.register()  # returns: vLLM goes on
    failure = "AttributeError: planted: this build has no VllmConfig.use_v2_model_runner"
    assert install_state.install_failure() == failure
    logged = _ppspec_lines(caplog)
    assert len(logged) == 1 and failure in logged[0] and "\n" not in logged[0], logged
    assert logged[0].startswith("vllm-ppspec: installing the plugin's patches failed"), logged
    with pytest.raises(RuntimeError) as e:
        install_state.require_installed()  # what the plugin's workers call first
    assert failure in str(e.value) and "vllm_ppspec.worker.PPSpecWorker" in str(e.value)


def test_a_supported_release_with_a_local_label_installs_without_a_warning(monkeypatch, caplog):
    import vllm

    monkeypatch.setattr(install_state, "failure", None)
    monkeypatch.setattr(vllm, "__version__", "0.33.0+cpu")
    plugin.register()
    assert _ppspec_lines(caplog) == []
    assert install_state.install_failure() is None
    install_state.require_installed()


# A vendor build whose CpuPlatform lacks its own check_and_update_config: the
# last patch fails after the others were installed. Then vLLM's own plugin
# loader runs the entry point, as every vLLM process does.
MID_INSTALL_FAILURE = """
import importlib
from vllm.platforms.cpu import CpuPlatform
del CpuPlatform.check_and_update_config
from vllm_ppspec.compat.registry import PATCHED_NAMES

def now():
    values = {}
    for module, qualname in PATCHED_NAMES:
        owner = importlib.import_module(module)
        *path, name = qualname.split(".")
        for part in path:
            owner = getattr(owner, part)
        values[(module, qualname)] = vars(owner).get(name)
    return values

before = now()
from vllm.plugins import load_general_plugins
load_general_plugins()
changed = [k for k, v in now().items() if v is not before[k]]
assert changed == [], changed
from vllm.config import VllmConfig
from vllm_ppspec import plugin
from vllm_ppspec.patches import config as config_patches
from vllm_ppspec.patches import install_state
assert not getattr(VllmConfig, config_patches.PATCHED_FLAG, False)
VllmConfig()  # vLLM builds its config as without the plugin
try:
    install_state.require_installed()
except RuntimeError as e:
    print("WORKER REFUSES:", e)
print("VLLM STILL RUNS")
"""


def test_a_failure_midway_is_undone_and_vllms_plugin_loader_goes_on():
    proc = subprocess.run(
        [sys.executable, "-c", MID_INSTALL_FAILURE], capture_output=True, text=True, timeout=300
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "VLLM STILL RUNS" in proc.stdout, out[-4000:]
    assert "WORKER REFUSES:" in proc.stdout and "KeyError: 'check_and_update_config'" in out
    errors = [line for line in out.splitlines() if "installing the plugin's patches failed" in line]
    assert len(errors) == 1 and "KeyError: 'check_and_update_config'" in errors[0], out[-4000:]
    assert "Traceback" not in out, out[-4000:]

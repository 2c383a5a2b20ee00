"""The patch registry (vllm_ppspec.patches.REGISTRY) names what the plugin changes."""

from __future__ import annotations

import importlib

from vllm_ppspec import version_guard
from vllm_ppspec.patches import REGISTRY


def test_every_config_patch_is_pinned_by_the_version_guard_and_nothing_else():
    registered = {t for p in REGISTRY if p.when == "config" for t in p.targets}
    pinned = {f"{module}:{qualname}" for module, qualname in version_guard.PATCHED_NAMES}
    assert registered == pinned


def test_every_patch_names_its_module_an_existing_target_and_an_end():
    for patch in REGISTRY:
        importlib.import_module(patch.module)
        assert patch.when in ("config", "worker", "engine core"), patch
        assert patch.versions and set(patch.versions) <= set(version_guard.SUPPORTED_VLLM_VERSIONS)
        assert patch.why and patch.how and patch.upstream and patch.remove_when, patch
        for target in patch.targets:
            module, qualname = target.split(":")
            obj: object = importlib.import_module(module)
            for part in qualname.split("."):
                obj = getattr(obj, part)  # raises if vLLM no longer has it

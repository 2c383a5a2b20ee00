"""The patch registry (vllm_ppspec.patches.REGISTRY) names what the plugin changes."""

from __future__ import annotations

import importlib

from vllm_ppspec import version_guard
from vllm_ppspec.patches import REGISTRY


def test_the_patched_names_are_the_config_entries_and_install_wraps_each():
    from vllm_ppspec.patches import PATCHED_NAMES
    from vllm_ppspec.plugin import register

    registered = {t for p in REGISTRY if p.when == "config" for t in p.targets}
    assert {f"{module}:{qualname}" for module, qualname in PATCHED_NAMES} == registered
    register()
    for module, qualname in PATCHED_NAMES:
        owner: object = importlib.import_module(module)
        *path, name = qualname.split(".")
        for part in path:
            owner = getattr(owner, part)
        attr = owner.__dict__[name]  # type: ignore[attr-defined]
        func = getattr(attr, "fget", None) or getattr(attr, "__func__", None) or attr
        assert hasattr(func, "__wrapped__"), f"{module}:{qualname} is not wrapped"


def test_every_instance_wrap_of_the_runner_is_registered():
    """The drafter scope's and the DP hook's wraps on the drafter instance."""
    from vllm_ppspec.runner.drafter.scope import DRAFTER_MODEL_METHODS

    base = "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer."
    scope = {
        t for p in REGISTRY if p.module == "vllm_ppspec.runner.drafter.scope" for t in p.targets
    }
    for name in (*DRAFTER_MODEL_METHODS, "_create_draft_vllm_config"):
        assert base + name in scope, name
    hook = {
        t for p in REGISTRY if p.module == "vllm_ppspec.runner.drafter.dp_hook" for t in p.targets
    }
    for name in ("propose", "dummy_run", "_determine_batch_execution_and_padding"):
        assert base + name in hook, name


def test_every_patch_names_its_module_an_existing_target_and_an_end():
    for patch in REGISTRY:
        importlib.import_module(patch.module)
        assert patch.when in ("config", "worker", "engine core", "runner"), patch
        assert patch.versions and set(patch.versions) <= set(version_guard.SUPPORTED_VLLM_VERSIONS)
        assert patch.why and patch.how and patch.upstream and patch.remove_when, patch
        for target in patch.targets:
            module, qualname = target.split(":")
            obj: object = importlib.import_module(module)
            for part in qualname.split("."):
                obj = getattr(obj, part)  # raises if vLLM no longer has it

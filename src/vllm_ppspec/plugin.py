"""Install the config patches from vLLM's general-plugin hook, or undo them and record why.

The entry point of group ``vllm.general_plugins``."""

from __future__ import annotations

from typing import Any

from vllm_ppspec.patches import install_state

UNSUPPORTED_WARNING = (
    "vllm-ppspec: vLLM {found} is not supported (supported: {supported}); the plugin "
    "installs nothing, and vLLM runs as without it. Selecting the plugin's worker "
    "(--worker-cls vllm_ppspec.worker.PPSpecWorker) fails on this version."
)
INSTALL_FAILED = (
    "vllm-ppspec: installing the plugin's patches failed ({failure}); they were undone, "
    "and vLLM runs as without the plugin. The plugin's worker refuses to start."
)


def register() -> None:
    """Install the config patches on a supported vLLM; on any other, warn and do nothing.

    vLLM calls this in every process it starts (API server, engine core,
    workers), possibly more than once, whatever the worker: it must never stop
    vLLM itself. On a vLLM without the V1 runner (0.34.0 on) the warning says
    what serves PP + speculative decoding there (:mod:`.no_v1_runner`). Only
    selecting the plugin's worker refuses an unsupported version
    (``vllm_ppspec.worker`` checks it at import) or a failed install
    (:func:`.patches.install_state.require_installed`, which names the failure).
    A failed install logs one error line and undoes what it had changed.
    Idempotent.
    """
    from vllm_ppspec.compat.guard import (
        SUPPORTED_VLLM_VERSIONS,
        installed_vllm_label,
        installed_vllm_version,
        supported_text,
    )

    if installed_vllm_version() not in SUPPORTED_VLLM_VERSIONS:
        from vllm_ppspec.compat import no_v1_runner

        found = installed_vllm_label()
        if no_v1_runner.removed():  # 0.34.0 on: what serves there, and what to install
            _logger().warning_once(no_v1_runner.warning(found))
        else:
            _logger().warning_once(
                UNSUPPORTED_WARNING.format(found=found, supported=supported_text())
            )
        return
    saved: list[tuple[Any, str, Any]] = []
    try:
        saved = _patched_attributes()
        from vllm_ppspec.patches import install_group
        from vllm_ppspec.patches.config import installed, mark_installed

        # Plugins may be loaded repeatedly: each install returns at once when
        # the whole group is in (installed()).
        install_group("config")
        if not installed():
            mark_installed()
    except Exception as e:  # any failure: vLLM goes on without the plugin
        _restore(saved)
        install_state.failure = f"{type(e).__name__}: {e}"
        _logger().error(INSTALL_FAILED.format(failure=install_state.failure))
        _logger().debug("vllm-ppspec: the failed install", exc_info=True)
        return
    install_state.failure = None


def _logger() -> Any:
    from vllm.logger import init_logger

    return init_logger("vllm.ppspec")


_ABSENT = object()


def _patched_attributes() -> list[tuple[Any, str, Any]]:
    """(owner, name, own value or _ABSENT) of every vLLM name the config patches
    replace (``vllm_ppspec.compat.registry.PATCHED_NAMES``), as they are now."""
    import importlib

    from vllm_ppspec.compat.registry import PATCHED_NAMES

    saved = []
    for module, qualname in PATCHED_NAMES:
        owner: Any = importlib.import_module(module)
        *path, name = qualname.split(".")
        for part in path:
            owner = getattr(owner, part)
        saved.append((owner, name, vars(owner).get(name, _ABSENT)))
    return saved


def _restore(saved: list[tuple[Any, str, Any]]) -> None:
    """Put back what :func:`_patched_attributes` saw."""
    for owner, name, value in saved:
        if value is not _ABSENT:
            setattr(owner, name, value)
        elif name in vars(owner):
            delattr(owner, name)

"""vLLM general-plugin entry point (group ``vllm.general_plugins``)."""

from __future__ import annotations

from typing import Any

UNSUPPORTED_WARNING = (
    "vllm-ppspec: vLLM {found} is not supported (supported: {supported}); the plugin "
    "installs nothing, and vLLM runs as without it. Selecting the plugin's worker "
    "(--worker-cls vllm_ppspec.worker.PPSpecWorker) fails on this version."
)
INSTALL_FAILED = (
    "vllm-ppspec: installing the plugin's patches failed ({failure}); they were undone, "
    "and vLLM runs as without the plugin. The plugin's worker refuses to start."
)

# Why install() failed in this process ("ExceptionType: message"), or None.
_failure: str | None = None


def install_failure() -> str | None:
    """Why the patches could not be installed in this process, or None."""
    return _failure


def require_installed() -> None:
    """Raise unless this process runs with the patches (called by the workers).

    Without them (the ``ppspec`` plugin filtered out by ``VLLM_PLUGINS``, or
    its install failed and was undone) the V2 runner could be chosen and the
    batch queue would be PP-deep, which gives wrong tokens instead of an error.
    """
    from vllm.config.vllm import VllmConfig

    from vllm_ppspec import WORKER_QUALNAME
    from vllm_ppspec.patches.config import PATCHED_FLAG

    failure = install_failure()
    if failure is not None:
        raise RuntimeError(
            f"--worker-cls {WORKER_QUALNAME}: vllm-ppspec's vLLM plugin failed to install "
            f"its patches in this process ({failure}), so its worker cannot run; leave "
            "--worker-cls at auto for vLLM's own worker, or use a vLLM build the plugin "
            "installs on."
        )
    if not getattr(VllmConfig, PATCHED_FLAG, False):
        raise RuntimeError(
            f"--worker-cls {WORKER_QUALNAME} needs vllm-ppspec's vLLM plugin 'ppspec', "
            "which was not loaded in this process: include 'ppspec' in VLLM_PLUGINS (or "
            "unset it) and check that vllm-ppspec is installed in this environment."
        )


def register() -> None:
    """Install the config patches on a supported vLLM; on any other, warn and do nothing.

    vLLM calls this in every process it starts (API server, engine core,
    workers), possibly more than once, whatever the worker: it must never stop
    vLLM itself. Only selecting the plugin's worker refuses an unsupported
    version (``vllm_ppspec.worker`` checks it at import) or a failed install
    (:func:`require_installed`, which names :func:`install_failure`).
    A failed install logs one error line and undoes what it had changed.
    Idempotent.
    """
    global _failure
    from vllm_ppspec.version_guard import (
        SUPPORTED_VLLM_VERSIONS,
        installed_vllm_label,
        installed_vllm_version,
        supported_text,
    )

    if installed_vllm_version() not in SUPPORTED_VLLM_VERSIONS:
        _logger().warning_once(
            UNSUPPORTED_WARNING.format(found=installed_vllm_label(), supported=supported_text())
        )
        return
    saved: list[tuple[Any, str, Any]] = []
    try:
        saved = _patched_attributes()
        from vllm_ppspec.patches.config import install

        install()
    except Exception as e:  # any failure: vLLM goes on without the plugin
        _restore(saved)
        _failure = f"{type(e).__name__}: {e}"
        _logger().error(INSTALL_FAILED.format(failure=_failure))
        _logger().debug("vllm-ppspec: the failed install", exc_info=True)
        return
    _failure = None


def _logger() -> Any:
    from vllm.logger import init_logger

    return init_logger("vllm.ppspec")


_ABSENT = object()


def _patched_attributes() -> list[tuple[Any, str, Any]]:
    """(owner, name, own value or _ABSENT) of every vLLM name the config patches
    replace (``vllm_ppspec.patches.PATCHED_NAMES``), as they are now."""
    import importlib

    from vllm_ppspec.patches import PATCHED_NAMES

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

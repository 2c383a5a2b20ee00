"""vLLM general-plugin entry point (group ``vllm.general_plugins``)."""

from __future__ import annotations

UNSUPPORTED_WARNING = (
    "vllm-ppspec: vLLM {found} is not supported (supported: {supported}); the plugin "
    "installs nothing, and vLLM runs as without it. Selecting the plugin's worker "
    "(--worker-cls vllm_ppspec.worker.PPSpecWorker) fails on this version."
)


def register() -> None:
    """Install the config patches on a supported vLLM; on any other, warn and do nothing.

    vLLM calls this in every process it starts (API server, engine core,
    workers), possibly more than once, whatever the worker: it must never stop
    vLLM itself. Only selecting the plugin's worker refuses an unsupported
    version (``vllm_ppspec.worker`` checks it at import). Idempotent.
    """
    from vllm_ppspec.version_guard import (
        SUPPORTED_VLLM_VERSIONS,
        installed_vllm_version,
        supported_text,
    )

    found = installed_vllm_version()
    if found not in SUPPORTED_VLLM_VERSIONS:
        from vllm.logger import init_logger

        init_logger("vllm.ppspec").warning_once(
            UNSUPPORTED_WARNING.format(found=found, supported=supported_text())
        )
        return
    from vllm_ppspec.patches.config import install

    install()

"""Record whether this process runs with the config patches; refuse a worker without them.

The plugin hook (:func:`vllm_ppspec.plugin.register`) records its outcome; the
plugin's workers check it before anything else (:func:`require_installed`)."""

from __future__ import annotations

# Why install() failed in this process ("ExceptionType: message"), or None.
failure: str | None = None


def install_failure() -> str | None:
    """Why the patches could not be installed in this process, or None."""
    return failure


def require_installed() -> None:
    """Raise unless this process runs with the patches (called by the workers).

    Without them (the ``ppspec`` plugin filtered out by ``VLLM_PLUGINS``, or
    its install failed and was undone) the V2 runner could be chosen and the
    batch queue would be PP-deep, which gives wrong tokens instead of an error.
    """
    from vllm.config.vllm import VllmConfig

    from vllm_ppspec import WORKER_QUALNAME
    from vllm_ppspec.patches.config import PATCHED_FLAG

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

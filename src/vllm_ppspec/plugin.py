"""vLLM general-plugin entry point (group ``vllm.general_plugins``)."""

from __future__ import annotations


def register() -> None:
    """Refuse an untested vLLM version, then install the config patches.

    vLLM calls this in every process it starts (API server, engine core,
    workers), possibly more than once; it is idempotent.
    """
    from vllm_ppspec.version_guard import check_version

    check_version()
    from vllm_ppspec.config_patches import install

    install()

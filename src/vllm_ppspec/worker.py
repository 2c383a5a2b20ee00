"""Export the one name for ``--worker-cls``: ``vllm_ppspec.worker.PPSpecWorker``.

It is vLLM's CPU worker subclass on the CPU platform and vLLM's GPU worker
subclass everywhere else; both build a runner with the same PP + spec mixin.
"""

from __future__ import annotations

from vllm_ppspec.compat.guard import check_vllm

check_vllm()

from vllm.platforms import current_platform  # noqa: E402

if current_platform.is_cpu():
    from vllm_ppspec.workers.cpu import PPSpecCPUWorker as PPSpecWorker
else:
    from vllm_ppspec.workers.gpu import PPSpecGPUWorker as PPSpecWorker  # type: ignore[assignment]

__all__ = ["PPSpecWorker"]

"""Make vLLM's CPU worker build PPSpecCPUModelRunner (and install the CPU patches)."""

from __future__ import annotations

import vllm.v1.worker.cpu_worker as _vllm_cpu_worker
from vllm.v1.worker.cpu_worker import CPUWorker

import vllm_ppspec.runner.platform.cpu as _cpu_runner  # runs the version guard first
from vllm_ppspec.patches import cpu_eager, cpu_expand, cpu_moe, cpu_ngram_threads
from vllm_ppspec.patches.install_state import require_installed
from vllm_ppspec.runner.clocks import WorkerClocks
from vllm_ppspec.runner.health.orderly_stop import StopsInOrder
from vllm_ppspec.runner.health.rank_errors import RankErrorsEndEngine


class PPSpecCPUWorker(RankErrorsEndEngine, WorkerClocks, StopsInOrder, CPUWorker):
    def init_device(self) -> None:
        # With the patches installed, use_v2_model_runner is False for this
        # worker (or VLLM_USE_V2_MODEL_RUNNER=1 was refused already).
        require_installed()
        # vLLM registered its CPU kernel fallbacks before building this worker;
        # replace the broken expand kernel (patches/cpu_expand.py).
        cpu_expand.install()
        # Async spec decode: no inductor compile mid-serving (patches/cpu_eager.py).
        cpu_eager.install()
        # MoE layers at DP > 1 need all_gatherv / reduce_scatterv, which vLLM's
        # CpuCommunicator lacks (patches/cpu_moe.py); set them before the
        # distributed groups are built.
        cpu_moe.install()
        # CPUWorker.init_device constructs the runner by the module-level name
        # CPUModelRunner; point that name at our runner for this call only.
        original = _vllm_cpu_worker.CPUModelRunner
        _vllm_cpu_worker.CPUModelRunner = _cpu_runner.PPSpecCPUModelRunner  # type: ignore[misc]
        try:
            super().init_device()
        finally:
            _vllm_cpu_worker.CPUModelRunner = original  # type: ignore[misc]
        # vLLM bound this worker's threads above; its ngram proposer must not
        # change their number (patches/cpu_ngram_threads.py).
        spec = self.vllm_config.speculative_config
        if spec is not None and spec.method == "ngram":
            cpu_ngram_threads.install()

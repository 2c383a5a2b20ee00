"""Make vLLM's CPU worker build PPSpecCPUModelRunner, with the registry's worker patches."""

from __future__ import annotations

import vllm.v1.worker.cpu_worker as _vllm_cpu_worker
from vllm.v1.worker.cpu_worker import CPUWorker

import vllm_ppspec.runner.cpu_runner as _cpu_runner  # runs the version guard first
from vllm_ppspec.choice import layer_split
from vllm_ppspec.patches import install_group
from vllm_ppspec.patches.install_state import require_installed
from vllm_ppspec.runner.clocks import WorkerClocks
from vllm_ppspec.runner.health.orderly_stop import StopsInOrder
from vllm_ppspec.runner.health.rank_errors import RankErrorsEndEngine


class PPSpecCPUWorker(RankErrorsEndEngine, WorkerClocks, StopsInOrder, CPUWorker):
    def init_device(self) -> None:
        # With the patches installed, use_v2_model_runner is False for this
        # worker (or VLLM_USE_V2_MODEL_RUNNER=1 was refused already).
        require_installed()
        # Before anything reads the layer split (layer_split.py).
        layer_split.apply(self.vllm_config)
        # The registry's worker group, before vLLM's init_device builds the
        # runner and the distributed groups: cpu_expand, cpu_eager, cpu_moe, cpu_shm_names,
        # remote_reads on a headless node.
        install_group("worker", self, cpu=True)
        # CPUWorker.init_device constructs the runner by the module-level name
        # CPUModelRunner; point that name at our runner for this call only.
        original = _vllm_cpu_worker.CPUModelRunner
        _vllm_cpu_worker.CPUModelRunner = _cpu_runner.PPSpecCPUModelRunner  # type: ignore[misc]
        try:
            super().init_device()
        finally:
            _vllm_cpu_worker.CPUModelRunner = original  # type: ignore[misc]
        # vLLM bound this worker's threads above: cpu_ngram_threads (ngram only).
        install_group("worker", self, cpu=True, after_init=True)

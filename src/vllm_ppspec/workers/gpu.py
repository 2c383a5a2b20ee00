"""Make vLLM's GPU worker build PPSpecGPUModelRunner (always the V1 runner)."""

from __future__ import annotations

from vllm.v1.worker.gpu_worker import Worker  # noqa: E402

from vllm_ppspec.choice import layer_split
from vllm_ppspec.patches import install_group
from vllm_ppspec.patches.install_state import require_installed
from vllm_ppspec.runner.clocks import WorkerClocks
from vllm_ppspec.runner.health.orderly_stop import StopsInOrder
from vllm_ppspec.runner.health.rank_errors import RankErrorsEndEngine
from vllm_ppspec.runner.mixin import PPSpecGPUModelRunner  # runs the version guard first


class PPSpecGPUWorker(RankErrorsEndEngine, WorkerClocks, StopsInOrder, Worker):
    def init_device(self) -> None:
        # The registry's worker group (remote_reads on a headless node; the
        # CPU-only entries stay out), before and after vLLM's init_device.
        install_group("worker", self)
        # Before anything reads the layer split (layer_split.py).
        layer_split.apply(self.vllm_config)
        super().init_device()
        install_group("worker", self, after_init=True)

    def _make_model_runner(self) -> PPSpecGPUModelRunner:
        # With the patches installed, use_v2_model_runner is False for this
        # worker (or VLLM_USE_V2_MODEL_RUNNER=1 was refused already).
        require_installed()
        return PPSpecGPUModelRunner(self.vllm_config, self.device)

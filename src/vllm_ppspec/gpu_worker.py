"""vLLM's GPU worker, building PPSpecGPUModelRunner (always the V1 runner)."""

from __future__ import annotations

from vllm.v1.worker.gpu_worker import Worker  # noqa: E402

from vllm_ppspec.runner import PPSpecGPUModelRunner  # runs the version guard first


class PPSpecGPUWorker(Worker):
    def _make_model_runner(self) -> PPSpecGPUModelRunner:
        if self.use_v2_model_runner:
            raise ValueError(
                "vllm-ppspec extends vLLM's V1 model runner; unset "
                "VLLM_USE_V2_MODEL_RUNNER (or set it to 0) to use "
                "--worker-cls vllm_ppspec.worker.PPSpecWorker."
            )
        return PPSpecGPUModelRunner(self.vllm_config, self.device)
